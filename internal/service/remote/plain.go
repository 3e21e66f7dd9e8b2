package remote

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"sync"
	"syscall"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/api/stream"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/service"
	"github.com/clade-sandbox/clade/sdk"
)

// startPlain runs an exec whose caller only reads its output
// (service.Plain) as a plain request on one of the client's kept-alive
// connections, and returns once the node answered: started (a node
// flushes the Started frame to a peer with its answer, so the pid is
// known at once) or refused. Its output is read in the caller's
// goroutine (service.Frames), or pumped into Stdout and Stderr for a
// caller that reads those.
func (s *Service) startPlain(ctx context.Context, id string, sreq sdk.ExecRequest) (service.Process, error) {
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	// The caller giving up before the answer ends the request; after it,
	// the process's Close does.
	stop := context.AfterFunc(ctx, cancel)
	es, err := s.c.StartExec(pctx, id, sreq)
	stop()
	if err != nil {
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, classify(err)
	}
	p := &plainProcess{es: es, cancel: cancel, done: make(chan struct{})}
	// The first frame is the Started one from a node that sends it (it
	// came with the answer); any other is kept for the reader.
	f, err := es.Next()
	switch {
	case err != nil:
		p.end(err)
	case f.Type == stream.Started:
		var st api.Started
		if json.Unmarshal(f.Payload, &st) == nil && st.PID > 0 {
			p.pid = st.PID
		}
	default:
		p.first = &stream.Frame{Type: f.Type, Payload: bytes.Clone(f.Payload)}
	}
	return p, nil
}

// plainProcess is a plain exec's process on a remote node.
type plainProcess struct {
	es     *sdk.ExecStream
	cancel context.CancelFunc
	pid    int
	first  *stream.Frame // a frame read before the reader came

	mu     sync.Mutex
	reader int // who reads es: 0 nobody yet, readFrames or readPipes; guarded by mu
	stdout *io.PipeReader
	stderr *io.PipeReader

	endOnce sync.Once
	done    chan struct{}
	exit    api.ExitStatus // set before done closes
	err     error
}

const (
	readFrames = 1 + iota // NextFrame
	readPipes             // the pump, for Stdout and Stderr
)

var _ service.Frames = (*plainProcess)(nil)

var errReadOtherWay = errors.New("this process's output is read the other way (NextFrame, or Stdout and Stderr)")

// take makes how the output is read; it reports whether it is (now) read
// that way, and whether this call chose it.
func (p *plainProcess) take(how int) (ok, first bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reader == 0 {
		p.reader = how
		if how == readPipes {
			p.startPump()
		}
		return true, true
	}
	return p.reader == how, false
}

// NextFrame returns the next stdout or stderr frame (service.Frames).
func (p *plainProcess) NextFrame() (stream.Frame, error) {
	if ok, _ := p.take(readFrames); !ok {
		return stream.Frame{}, errReadOtherWay
	}
	return p.next()
}

// next reads the next output frame; only the reader calls it.
func (p *plainProcess) next() (stream.Frame, error) {
	if f := p.first; f != nil {
		p.first = nil
		if f.Type == stream.Stdout || f.Type == stream.Stderr {
			return *f, nil
		}
	}
	for {
		select {
		case <-p.done:
			return stream.Frame{}, io.EOF
		default:
		}
		f, err := p.es.Next()
		if err != nil {
			p.end(err)
			return stream.Frame{}, err
		}
		// Started again, or a type this node does not know: not the
		// client's (this node speaks its own version of the stream).
		if f.Type == stream.Stdout || f.Type == stream.Stderr {
			return f, nil
		}
	}
}

// end records the stream's end (io.EOF: its exit frame) and frees the
// request.
func (p *plainProcess) end(err error) {
	p.endOnce.Do(func() {
		if err == io.EOF {
			p.exit, p.err = p.es.Exit()
			p.err = classify(p.err)
		} else {
			p.err = classify(err)
		}
		_ = p.es.Close()
		p.cancel()
		close(p.done)
	})
}

// startPump copies the frames into Stdout's and Stderr's pipes, in a
// goroutine of its own; mu is held.
func (p *plainProcess) startPump() {
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	p.stdout, p.stderr = outR, errR
	go func() {
		for {
			f, err := p.next()
			if err != nil {
				if err == io.EOF {
					err = nil
				}
				outW.CloseWithError(err)
				errW.CloseWithError(err)
				return
			}
			w := outW
			if f.Type == stream.Stderr {
				w = errW
			}
			if _, err := w.Write(f.Payload); err != nil {
				p.cancel() // closed: the stream ends, the node kills the command
			}
		}
	}()
}

func (p *plainProcess) PID() int { return p.pid }

func (p *plainProcess) Stdin() io.WriteCloser { return nil }

func (p *plainProcess) Stdout() io.Reader {
	if ok, _ := p.take(readPipes); !ok {
		return errReader{errReadOtherWay}
	}
	return p.stdout
}

func (p *plainProcess) Stderr() io.Reader {
	if ok, _ := p.take(readPipes); !ok {
		return errReader{errReadOtherWay}
	}
	return p.stderr
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

func (p *plainProcess) Signal(sig syscall.Signal) error {
	return errdefs.New(errdefs.InvalidArgument, "this exec was started for its output only (service.Plain): it takes no signals")
}

func (p *plainProcess) Resize(rows, cols uint16) error {
	return errdefs.New(errdefs.InvalidArgument, "the process has no terminal to resize")
}

// Wait waits for the stream's end; a process nobody reads yet is read
// into Stdout and Stderr (which must then be read, as Process says).
func (p *plainProcess) Wait(ctx context.Context) (api.ExitStatus, error) {
	p.take(readPipes)
	select {
	case <-p.done:
		return p.exit, p.err
	case <-ctx.Done():
		return api.ExitStatus{}, ctx.Err()
	}
}

// Close drops the request if the stream has not ended (the node kills
// the command) and, unless a NextFrame reader is on it (that reader sees
// the end), waits for the end.
func (p *plainProcess) Close() {
	p.cancel()
	if pumped, _ := p.take(readPipes); pumped {
		p.stdout.CloseWithError(io.ErrClosedPipe)
		p.stderr.CloseWithError(io.ErrClosedPipe)
		<-p.done
	}
}
