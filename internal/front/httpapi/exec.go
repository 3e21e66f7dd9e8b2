package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/api/stream"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/service"
)

// exec runs a command and streams its output as api/stream frames: stdout
// and stderr data as they come, then exit. With an `Upgrade: clade-stream`
// request the connection becomes two-way and the client sends stdin, signal
// and close frames.
func (s *Server) exec(w http.ResponseWriter, r *http.Request) error {
	req, err := decodeExec(r)
	if err != nil {
		return err
	}
	if req.Keep || req.Tag != "" {
		// The kept list and attach are the cluster's nodes' (the
		// internal routes below): a user's kept command would run on
		// with nothing of the API to reach it again.
		return errdefs.New(errdefs.InvalidArgument, "keep and tag are not served on the public API (only between a cluster's nodes, which list and attach to kept commands): leave them out")
	}
	return s.serveExec(w, r, req)
}

func decodeExec(r *http.Request) (api.ExecRequest, error) {
	var req api.ExecRequest
	if v := r.Header.Get(stream.VersionHeader); v != "" && v != strconv.Itoa(stream.Version) {
		return req, errdefs.New(errdefs.InvalidArgument, "exec stream version %q is not supported: this daemon speaks version %d; upgrade the client or the daemon", v, stream.Version)
	}
	err := decode(r, &req)
	return req, err
}

func (s *Server) serveExec(w http.ResponseWriter, r *http.Request, req api.ExecRequest) error {
	upgrade := strings.EqualFold(r.Header.Get("Upgrade"), api.UpgradeProtocol)
	if req.Stdin && !upgrade {
		return errdefs.New(errdefs.InvalidArgument, "stdin needs a two-way stream: send the request with `Connection: Upgrade` and `Upgrade: %s`", api.UpgradeProtocol)
	}
	ctx := r.Context()
	if !upgrade {
		// Nothing but output goes to it: a remote node's service may
		// use a kept-alive connection (the proxied exec's hop).
		ctx = service.Plain(ctx)
	}
	p, err := s.svc.Exec(ctx, r.PathValue("id"), service.Wake, req)
	if err != nil {
		return err
	}
	return s.streamExec(w, r, p, upgrade)
}

// wakeQuery reads ?wake= (true by default).
func wakeQuery(r *http.Request) (service.WakeMode, error) {
	v := r.URL.Query().Get("wake")
	if v == "" {
		return service.Wake, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return service.NoWake, errdefs.New(errdefs.InvalidArgument, "wake=%.40q: give true or false", v)
	}
	return service.WakeMode(b), nil
}

// streamExec streams p (an exec's or an attach's) to the client and
// closes it: a plain stream of output frames, or, upgraded, a two-way one
// whose client sends stdin, signal, resize and close frames.
func (s *Server) streamExec(w http.ResponseWriter, r *http.Request, p service.Process, upgrade bool) error {
	defer p.Close()

	var out *stream.Writer
	if upgrade {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return err
		}
		defer conn.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + api.UpgradeProtocol +
			"\r\n" + stream.VersionHeader + ": " + strconv.Itoa(stream.Version) + "\r\n\r\n")
		if err := brw.Flush(); err != nil {
			return nil
		}
		out = stream.NewWriter(conn, nil)
		go readClientFrames(brw.Reader, p)
	} else {
		w.Header().Set("Content-Type", api.StreamContentType)
		w.Header().Set(stream.VersionHeader, strconv.Itoa(stream.Version))
		w.WriteHeader(http.StatusOK)
		out = stream.NewWriter(w, http.NewResponseController(w).Flush)
	}
	if pid := p.PID(); pid != 0 {
		// Unflushed: a plain stream's client has no use for the pid
		// before the output, and it costs no write of its own.
		b, _ := json.Marshal(api.Started{PID: pid})
		if IsClusterPeer(r.Context()) {
			// A node proxying the exec waits for the pid before it
			// answers its own client: flushed at once.
			_ = out.Write(stream.Started, b)
		} else {
			_ = out.WriteUnflushed(stream.Started, b)
		}
	}
	streamProcess(r, p, out)
	return nil
}

// streamProcess copies a process's output to the client as frames and ends
// with its exit frame.
func streamProcess(r *http.Request, p service.Process, out *stream.Writer) {
	// A client that goes away takes its command with it.
	stop := context.AfterFunc(r.Context(), p.Close)
	defer stop()
	if fs, ok := p.(service.Frames); ok {
		relayFrames(fs, p, out)
	} else {
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); _ = out.Copy(stream.Stdout, p.Stdout()) }()
		go func() { defer wg.Done(); _ = out.Copy(stream.Stderr, p.Stderr()) }()
		wg.Wait()
	}
	st, err := p.Wait(r.Context())
	if err != nil {
		st = api.ExitStatus{Code: -1, Error: err.Error(), ErrorClass: string(errdefs.ClassOf(err))}
	}
	b, _ := json.Marshal(st)
	_ = out.WriteLast(stream.Exit, b)
}

// relayFrames sends the client a remote node's output frames as they
// come, in their order, in this goroutine (the proxied exec's hop): the
// next is read once the client took the last, so the holder's sending
// waits for the client. A client gone ends the process; its stream is
// read to its end still.
func relayFrames(fs service.Frames, p service.Process, out *stream.Writer) {
	failed := false
	for {
		f, err := fs.NextFrame()
		if err != nil {
			return
		}
		if out.Write(f.Type, f.Payload) != nil && !failed {
			failed = true
			p.Close()
		}
	}
}

var errClientGone = errors.New("the client went away")

// readClientFrames forwards stdin and signals from an upgraded connection
// to the process; frame types it does not know are ignored. A client that
// goes away takes its process with it.
func readClientFrames(br *bufio.Reader, p service.Process) {
	// Stdin goes through a pipe so that a write waiting for the agent's
	// window never holds up a signal or close frame behind it.
	var stdin *io.PipeWriter
	if in := p.Stdin(); in != nil {
		pr, pw := io.Pipe()
		stdin = pw
		go func() {
			if _, err := io.Copy(in, pr); err == nil {
				_ = in.Close()
			}
			_, _ = io.Copy(io.Discard, pr) // the process is gone; drain
		}()
		// A client gone (or a close frame) is no EOF of stdin: a kept
		// command it detaches from keeps its stdin open for an attach.
		defer pw.CloseWithError(errClientGone)
	}
	r := stream.NewReader(br)
	for {
		f, err := r.Read()
		if err != nil {
			if stdin != nil {
				stdin.CloseWithError(errClientGone)
			}
			p.Close()
			return
		}
		switch f.Type {
		case stream.Stdin:
			if stdin == nil {
				continue
			}
			if len(f.Payload) == 0 {
				_ = stdin.Close()
			} else if _, err := stdin.Write(f.Payload); err != nil {
				continue
			}
		case stream.Signal:
			if sig, ok := stream.ParseSignal(f.Payload); ok {
				_ = p.Signal(sig)
			}
		case stream.Close:
			if stdin != nil {
				stdin.CloseWithError(errClientGone)
			}
			p.Close()
		case stream.Resize:
			if rows, cols, ok := stream.ParseResize(f.Payload); ok {
				_ = p.Resize(rows, cols)
			}
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
	tr, err := s.svc.CopyOut(r.Context(), id, service.Wake, p)
	if err != nil {
		return err
	}
	defer tr.Close()
	// The status waits for the archive's first bytes: a path the agent
	// refuses before sending any (a FIFO, a device, a socket) is a 4xx
	// with its reason, not a 200 cut off.
	br := bufio.NewReaderSize(tr, 64<<10)
	if _, err := br.Peek(1); err != nil && err != io.EOF {
		return err
	}
	w.Header().Set("Content-Type", "application/x-tar")
	w.WriteHeader(http.StatusOK)
	if _, err := br.WriteTo(w); err != nil {
		// Too late for a status code: break the stream so the client sees
		// a truncated archive fail instead of a short one succeed.
		s.log.Warn("file transfer failed", "sandbox", id, "path", p, "err", err)
		panic(http.ErrAbortHandler)
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
	// The body goes through a pipe, so that the copy into the sandbox can
	// be cut off (closing the pipe) when the extraction ends early.
	pr, pw := io.Pipe()
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		_, err := io.CopyBuffer(pw, r.Body, make([]byte, 256<<10))
		pw.CloseWithError(err)
	}()
	// The handler may not return while the body is still being read. Only
	// a copy still blocked on the client (the extraction failed early) is
	// cut off with a read deadline: set on a body read to its end, the
	// deadline would break the kept-alive connection for the next request.
	defer func() {
		pr.CloseWithError(errors.New("extraction ended"))
		select {
		case <-copied:
		case <-time.After(time.Second):
			_ = http.NewResponseController(w).SetReadDeadline(time.Now())
			<-copied
		}
	}()
	if err := s.svc.CopyIn(r.Context(), r.PathValue("id"), service.Wake, p, r.URL.Query().Get("user"), pr); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
