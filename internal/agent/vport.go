package agent

import (
	"context"
	"errors"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// A VM guest (the qemu engine) has no socket to the host: the agent talks
// over a virtio-serial port, a character device. The port has no
// connections: the host side (a QEMU chardev socket) comes and goes, and the
// guest sees reads return EOF while it is away and writes block until it is
// back. So a "dial" opens the device; the session that follows ends when a
// read returns EOF (the host closed its side). The host cannot see the
// port close, so the agent acknowledges a quiesce with a frame before it
// hangs up, and the host then drops its side too.

// isCharDevice reports whether path is a character device (a virtio port).
func isCharDevice(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// dialPort opens the port at path. After a quiesce the host drops its side
// once it reads the agent's acknowledgement; afterQuiesce waits (at most a
// second) for that, so that the next hello is not written into the host's
// old connection (if it is, the host redials a silent connection and the
// agent says hello again).
func dialPort(ctx context.Context, path string, afterQuiesce bool) (net.Conn, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	if afterQuiesce {
		_ = f.SetReadDeadline(time.Now().Add(time.Second))
		buf := make([]byte, 4096)
		for ctx.Err() == nil {
			if _, err := f.Read(buf); err != nil {
				break // EOF: the host is gone; or the deadline
			}
		}
		_ = f.SetReadDeadline(time.Time{})
	}
	return &portConn{f: f}, nil
}

// portConn is a virtio port as a net.Conn.
type portConn struct{ f *os.File }

type portAddr string

func (a portAddr) Network() string { return "virtio-port" }
func (a portAddr) String() string  { return string(a) }

func (c *portConn) Read(p []byte) (int, error)  { return c.f.Read(p) }
func (c *portConn) Write(p []byte) (int, error) { return c.f.Write(p) }
func (c *portConn) Close() error                { return c.f.Close() }
func (c *portConn) LocalAddr() net.Addr         { return portAddr(c.f.Name()) }
func (c *portConn) RemoteAddr() net.Addr        { return portAddr("host") }
func (c *portConn) SetDeadline(t time.Time) error {
	return errors.Join(c.f.SetReadDeadline(t), c.f.SetWriteDeadline(t))
}
func (c *portConn) SetReadDeadline(t time.Time) error  { return c.f.SetReadDeadline(t) }
func (c *portConn) SetWriteDeadline(t time.Time) error { return c.f.SetWriteDeadline(t) }

// reseed mixes seed into the kernel's entropy pool and makes the kernel
// reseed its random number generator from it at once (RNDRESEEDCRNG), so
// that two VMs restored from one snapshot read different random bytes.
func reseed(seed []byte) error {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Write(seed); err != nil {
		return err
	}
	const rndReseedCRNG = 0x5207 // _IO('R', 0x07)
	return unix.IoctlSetInt(int(f.Fd()), rndReseedCRNG, 0)
}
