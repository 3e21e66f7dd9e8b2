package httpapi

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/agent"
	"github.com/clade-sandbox/clade/internal/agent/wire"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/sandbox"
)

// exec runs a command and streams its output as wire frames on channel 0:
// stdout and stderr data as they come, then exit. With an
// `Upgrade: clade-stream` request the connection becomes two-way and the
// client sends stdin, signal and close frames.
func (s *Server) exec(w http.ResponseWriter, r *http.Request) error {
	var req api.ExecRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return errdefs.New(errdefs.InvalidArgument, "cmd is empty: give the command and its arguments")
	}
	for _, kv := range req.Env {
		if err := sandbox.ValidEnv(kv); err != nil {
			return err
		}
	}
	if req.Workdir != "" && !path.IsAbs(req.Workdir) {
		return errdefs.New(errdefs.InvalidArgument, "workdir %q must be an absolute path", req.Workdir)
	}
	if req.TimeoutMS < 0 {
		return errdefs.New(errdefs.InvalidArgument, "timeout_ms must not be negative")
	}
	upgrade := strings.EqualFold(r.Header.Get("Upgrade"), api.UpgradeProtocol)
	if req.Stdin && !upgrade {
		return errdefs.New(errdefs.InvalidArgument, "stdin needs a two-way stream: send the request with `Connection: Upgrade` and `Upgrade: %s`", api.UpgradeProtocol)
	}
	ch, err := s.mgr.Open(r.Context(), r.PathValue("id"), wire.Request{Op: wire.OpExec, Argv: req.Cmd, Env: req.Env,
		Dir: req.Workdir, TimeoutMS: req.TimeoutMS, Stdin: req.Stdin})
	if err != nil {
		return err
	}
	defer ch.Close()

	var out *frameWriter
	if upgrade {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return err
		}
		defer conn.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + api.UpgradeProtocol + "\r\n\r\n")
		if err := brw.Flush(); err != nil {
			return nil
		}
		out = &frameWriter{w: conn}
		go readClientFrames(brw.Reader, ch)
	} else {
		w.Header().Set("Content-Type", api.StreamContentType)
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		out = &frameWriter{w: w, flush: rc.Flush}
	}
	streamChannel(r, ch, out)
	return nil
}

// streamChannel copies a channel's output to the client as frames and ends
// with its exit frame.
func streamChannel(r *http.Request, ch *agent.Channel, out *frameWriter) {
	// A client that goes away takes its command with it.
	stop := context.AfterFunc(r.Context(), ch.Close)
	defer stop()
	var wg sync.WaitGroup
	wg.Add(2)
	go out.copy(&wg, wire.Stdout, ch.Stdout)
	go out.copy(&wg, wire.Stderr, ch.Stderr)
	wg.Wait()
	exit, err := ch.Wait(r.Context())
	st := api.ExitStatus{Code: exit.Code, Signal: exit.Signal, TimedOut: exit.TimedOut, Error: exit.Error, ErrorClass: exit.ErrorClass}
	if err != nil {
		st = api.ExitStatus{Code: -1, Error: err.Error(), ErrorClass: string(errdefs.ClassOf(err))}
	}
	b, _ := json.Marshal(st)
	_ = out.write(wire.Exit, b)
}

// readClientFrames forwards stdin and signals from an upgraded connection
// to the channel. A client that goes away takes its process with it.
func readClientFrames(br *bufio.Reader, ch *agent.Channel) {
	// Stdin goes through a pipe so that a write waiting for the agent's
	// window never holds up a signal or close frame behind it.
	var stdin *io.PipeWriter
	if ch.Stdin != nil {
		pr, pw := io.Pipe()
		stdin = pw
		go func() {
			if _, err := io.Copy(ch.Stdin, pr); err == nil {
				_ = ch.Stdin.Close()
			}
			_, _ = io.Copy(io.Discard, pr) // the process is gone; drain
		}()
		defer pw.Close()
	}
	r := wire.NewReader(br)
	for {
		f, err := r.Read()
		if err != nil {
			ch.Close()
			return
		}
		switch f.Type {
		case wire.Stdin:
			if stdin == nil {
				continue
			}
			if len(f.Payload) == 0 {
				_ = stdin.Close()
			} else if _, err := stdin.Write(f.Payload); err != nil {
				continue
			}
		case wire.Signal:
			if len(f.Payload) == 4 {
				_ = ch.Signal(int(binary.BigEndian.Uint32(f.Payload)))
			}
		case wire.Close:
			ch.Close()
		}
	}
}

// frameWriter serializes frames from several goroutines onto one response.
type frameWriter struct {
	mu    sync.Mutex
	w     io.Writer
	flush func() error
	buf   []byte
	err   error
}

func (f *frameWriter) write(t wire.Type, p []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	f.buf = wire.AppendFrame(f.buf[:0], t, 0, p)
	if _, err := f.w.Write(f.buf); err != nil {
		f.err = err
		return err
	}
	if f.flush != nil {
		if err := f.flush(); err != nil {
			f.err = err
		}
	}
	return f.err
}

func (f *frameWriter) copy(wg *sync.WaitGroup, t wire.Type, r io.Reader) {
	defer wg.Done()
	buf := make([]byte, wire.ChunkSize)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if werr := f.write(t, buf[:n]); werr != nil {
				// The client is gone: keep reading so the agent is not
				// blocked, the request context ends the channel.
				_, _ = io.Copy(io.Discard, r)
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// sandboxPath checks a path inside a sandbox given by a client.
func sandboxPath(p string) (string, error) {
	if p == "" {
		return "", errdefs.New(errdefs.InvalidArgument, "missing ?path=: give an absolute path inside the sandbox")
	}
	if !path.IsAbs(p) {
		return "", errdefs.New(errdefs.InvalidArgument, "path %q must be absolute inside the sandbox", p)
	}
	if strings.ContainsRune(p, 0) {
		return "", errdefs.New(errdefs.InvalidArgument, "path contains a NUL byte")
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return "", errdefs.New(errdefs.InvalidArgument, "path %q must not contain '..': it would escape its directory", p)
		}
	}
	return path.Clean(p), nil
}

// getFiles streams a file or directory out of a sandbox as a tar archive
// whose top-level entry is the path's base name.
func (s *Server) getFiles(w http.ResponseWriter, r *http.Request) error {
	p, err := sandboxPath(r.URL.Query().Get("path"))
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	if err := s.stat(r, id, p); err != nil {
		return err
	}
	ch, err := s.mgr.Open(r.Context(), id, wire.Request{Op: wire.OpTarGet, Path: p})
	if err != nil {
		return err
	}
	defer ch.Close()
	w.Header().Set("Content-Type", "application/x-tar")
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, ch.Stdout); err != nil {
		panic(http.ErrAbortHandler)
	}
	exit, err := ch.Wait(r.Context())
	if err == nil {
		err = agent.ExitError(exit)
	}
	if err != nil {
		// Too late for a status code: break the stream so the client sees
		// a truncated archive fail instead of a short one succeed.
		s.log.Warn("file transfer failed", "sandbox", id, "path", p, "err", err)
		panic(http.ErrAbortHandler)
	}
	return nil
}

func (s *Server) stat(r *http.Request, id, p string) error {
	ch, err := s.mgr.Open(r.Context(), id, wire.Request{Op: wire.OpStatFS, Path: p})
	if err != nil {
		return err
	}
	exit, err := ch.Wait(r.Context())
	if err != nil {
		return err
	}
	var st agent.StatInfo
	_ = json.Unmarshal(exit.Info, &st)
	if !st.Exists {
		return errdefs.New(errdefs.NotFound, "%s: no such file or directory in sandbox %s", p, id)
	}
	return nil
}

// putFiles extracts the tar archive in the body at path, with `docker cp`
// semantics: into path if it is a directory, else as path.
func (s *Server) putFiles(w http.ResponseWriter, r *http.Request) error {
	p, err := sandboxPath(r.URL.Query().Get("path"))
	if err != nil {
		return err
	}
	ch, err := s.mgr.Open(r.Context(), r.PathValue("id"), wire.Request{Op: wire.OpTarPut, Path: p, Stdin: true})
	if err != nil {
		return err
	}
	defer ch.Close()
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		_, _ = io.Copy(ch.Stdin, r.Body)
		_ = ch.Stdin.Close()
	}()
	// The handler may not return while the body is still being read. Only
	// a copy still blocked on the client (the extraction failed early) is
	// cut off with a read deadline: set on a body read to its end, the
	// deadline would break the kept-alive connection for the next request.
	defer func() {
		ch.Close()
		select {
		case <-copied:
		case <-time.After(time.Second):
			_ = http.NewResponseController(w).SetReadDeadline(time.Now())
			<-copied
		}
	}()
	exit, err := ch.Wait(r.Context())
	if err != nil {
		return err
	}
	if err := agent.ExitError(exit); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
