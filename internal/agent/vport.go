package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"time"

	"github.com/clade-sandbox/clade/internal/agent/wire"
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
// agent says hello again). A host that connects writes wire.Nudge first:
// it ends the wait too. In a VM restored from a snapshot the old host's
// hang-up may never show (the new QEMU's port is connected again before
// it tells the guest), and without the nudge every restored child would
// wait out the whole second.
func dialPort(ctx context.Context, path string, afterQuiesce bool) (net.Conn, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	if afterQuiesce {
		_ = f.SetReadDeadline(time.Now().Add(time.Second))
		drainUntilNudge(ctx, f)
		_ = f.SetReadDeadline(time.Time{})
	}
	return &portConn{f: f}, nil
}

// drainUntilNudge reads and drops what r gives until EOF, an error (the
// deadline), ctx's end or a nudge: the old host's last frames go, and a
// new host's nudge (which may follow them) ends the wait.
func drainUntilNudge(ctx context.Context, r io.Reader) {
	nudge := wire.Nudge()
	buf := make([]byte, 4096)
	var seen []byte // what was read, less what cannot start a nudge
	for ctx.Err() == nil {
		n, err := r.Read(buf)
		if n > 0 {
			seen = append(seen, buf[:n]...)
			if bytes.Contains(seen, nudge) {
				return
			}
			if k := len(seen) - (len(nudge) - 1); k > 0 {
				seen = append(seen[:0], seen[k:]...)
			}
		}
		if err != nil {
			return // EOF: the host is gone; or the deadline
		}
	}
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
