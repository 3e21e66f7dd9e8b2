package sdk

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/agent/wire"
)

// ExecRequest runs a command in a sandbox.
type ExecRequest struct {
	Cmd     []string
	Env     []string // KEY=VALUE, on top of the sandbox's environment
	Workdir string   // absolute; "/" by default
	// Timeout kills the command's whole process tree after this long.
	Timeout time.Duration
	// Stdin, when set, is streamed to the command, which sees EOF at its end.
	Stdin io.Reader
	// Stdout and Stderr receive the output as it is produced; nil discards.
	Stdout, Stderr io.Writer
	// Signals, when set, are forwarded to the command.
	Signals <-chan os.Signal
}

// Exec runs a command and waits for it. It returns the command's exit status;
// the error is for failures to run it at all. A command that is not found
// gives status 127 with Error set. Cancelling ctx kills the command.
func (c *Client) Exec(ctx context.Context, ref string, req ExecRequest) (ExitStatus, error) {
	body, err := json.Marshal(api.ExecRequest{Cmd: req.Cmd, Env: req.Env, Workdir: req.Workdir,
		TimeoutMS: req.Timeout.Milliseconds(), Stdin: req.Stdin != nil})
	if err != nil {
		return ExitStatus{}, err
	}
	path := "/v1/sandboxes/" + url.PathEscape(ref) + "/exec"
	if req.Stdin != nil || req.Signals != nil {
		return c.execUpgrade(ctx, path, body, req)
	}
	hreq, err := c.newRequest(ctx, http.MethodPost, path, bytes.NewReader(body))
	if err != nil {
		return ExitStatus{}, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := c.do(hreq)
	if err != nil {
		return ExitStatus{}, err
	}
	defer resp.Body.Close()
	return readStream(resp.Body, req)
}

// readStream writes output frames to req's writers until the exit frame.
func readStream(r io.Reader, req ExecRequest) (ExitStatus, error) {
	stdout, stderr := req.Stdout, req.Stderr
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	fr := wire.NewReader(bufio.NewReaderSize(r, 64<<10))
	for {
		f, err := fr.Read()
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return ExitStatus{}, fmt.Errorf("exec stream: %w", err)
		}
		switch f.Type {
		case wire.Stdout:
			if _, err := stdout.Write(f.Payload); err != nil {
				return ExitStatus{}, fmt.Errorf("write stdout: %w", err)
			}
		case wire.Stderr:
			if _, err := stderr.Write(f.Payload); err != nil {
				return ExitStatus{}, fmt.Errorf("write stderr: %w", err)
			}
		case wire.Exit:
			var st ExitStatus
			if err := json.Unmarshal(f.Payload, &st); err != nil {
				return ExitStatus{}, fmt.Errorf("exec stream: exit frame: %w", err)
			}
			if st.Code == -1 && st.Error != "" {
				return st, &Error{Code: st.ErrorClass, Message: st.Error}
			}
			return st, nil
		}
	}
}

// execUpgrade runs an exec on a two-way stream: stdin and signals go up,
// output comes down.
func (c *Client) execUpgrade(ctx context.Context, path string, body []byte, req ExecRequest) (ExitStatus, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return ExitStatus{}, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	hreq, err := c.newRequest(ctx, http.MethodPost, path, bytes.NewReader(body))
	if err != nil {
		return ExitStatus{}, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Connection", "Upgrade")
	hreq.Header.Set("Upgrade", api.UpgradeProtocol)
	if err := hreq.Write(conn); err != nil {
		return ExitStatus{}, ctxErr(ctx, err)
	}
	br := bufio.NewReaderSize(conn, 64<<10)
	resp, err := http.ReadResponse(br, hreq)
	if err != nil {
		return ExitStatus{}, ctxErr(ctx, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		if resp.StatusCode >= 400 {
			return ExitStatus{}, decodeError(resp)
		}
		return ExitStatus{}, fmt.Errorf("daemon did not upgrade the exec stream: %s", resp.Status)
	}
	fw := &frameConn{w: conn}
	done := make(chan struct{})
	defer close(done)
	if req.Stdin != nil {
		go func() {
			buf := make([]byte, wire.ChunkSize)
			for {
				n, err := req.Stdin.Read(buf)
				if n > 0 && fw.write(wire.Stdin, buf[:n]) != nil {
					return
				}
				if err != nil {
					_ = fw.write(wire.Stdin, nil)
					return
				}
			}
		}()
	}
	if req.Signals != nil {
		go func() {
			for {
				select {
				case <-done:
					return
				case sig := <-req.Signals:
					if s, ok := sig.(syscall.Signal); ok {
						_ = fw.write(wire.Signal, binary.BigEndian.AppendUint32(nil, uint32(s)))
					}
				}
			}
		}()
	}
	st, err := readStream(br, req)
	return st, ctxErr(ctx, err)
}

func ctxErr(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

type frameConn struct {
	mu  sync.Mutex
	w   io.Writer
	buf []byte
}

func (f *frameConn) write(t wire.Type, p []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.buf = wire.AppendFrame(f.buf[:0], t, 0, p)
	_, err := f.w.Write(f.buf)
	return err
}
