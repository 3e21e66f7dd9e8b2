package agent

import (
	"archive/tar"
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/clade-sandbox/clade/internal/agent/wire"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/tarx"
)

// channel is one request on a session: an exec or a file transfer.
type channel struct {
	s   *session
	id  uint32
	req wire.Request

	stdin  *wire.Receiver // nil unless req.Stdin
	stdout *wire.Sender
	stderr *wire.Sender

	mu   sync.Mutex
	proc *os.Process
	sock io.Closer // an OpDial's connection, an OpWatch's inotify
	pty  *os.File  // a TTY exec's terminal (master side), until it ends
	// hold is the resize being held against readline's write-back (see
	// holdSize), nil when none is.
	hold    *sizeHold
	aborted bool
	done    chan struct{}
	// kept and att: the kept command the channel follows (see kept.go).
	kept *keptCmd
	att  *attachment
	// quiesced: detached for a snapshot; the channel ends without an Exit
	// (the host is told by the quiesce, which an Exit must not race).
	quiesced bool
}

func newChannel(s *session, id uint32, req wire.Request) *channel {
	ch := &channel{s: s, id: id, req: req, done: make(chan struct{}),
		stdout: wire.NewSender(s.conn, id, wire.Stdout),
		stderr: wire.NewSender(s.conn, id, wire.Stderr)}
	if req.Stdin {
		ch.stdin = wire.NewReceiver(s.conn, id, wire.Stdin)
	}
	return ch
}

func (ch *channel) run(ctx context.Context) {
	defer ch.s.remove(ch.id)
	defer close(ch.done)
	var exit wire.ExitMsg
	if ch.req.Op != wire.OpIdentity {
		ch.s.a.hostFilesDone() // a request after a rename sees its files
	}
	switch ch.req.Op {
	case wire.OpExec:
		exit = ch.exec(ctx)
	case wire.OpTarGet:
		exit = ch.tarGet()
	case wire.OpTarPut:
		exit = ch.tarPut()
	case wire.OpStatFS:
		exit = ch.stat()
	case wire.OpIdentity:
		exit = ch.identity()
	case wire.OpDial:
		exit = ch.dial()
	case wire.OpWatch:
		exit = ch.watch()
	case wire.OpXattrGet:
		exit = ch.xattrGet()
	case wire.OpXattrSet:
		exit = ch.xattrSet()
	case wire.OpAttach:
		exit = ch.attachKept()
	case wire.OpKept:
		exit = ch.listKept()
	case wire.OpKillAll:
		exit = killAll(ctx)
	default:
		exit = errExit(errdefs.New(errdefs.InvalidArgument, "unknown op %q", ch.req.Op))
	}
	// No end-of-stream frames: the host ends both streams at Exit.
	ch.stdout.MarkClosed()
	ch.stderr.MarkClosed()
	if ch.stdin != nil {
		ch.stdin.CloseWithError(io.EOF)
	}
	ch.mu.Lock()
	quiesced := ch.quiesced
	ch.mu.Unlock()
	if quiesced {
		return
	}
	b, _ := json.Marshal(exit)
	_ = ch.s.conn.Write(wire.Exit, ch.id, b)
}

func errExit(err error) wire.ExitMsg {
	return wire.ExitMsg{Code: -1, Error: err.Error(), ErrorClass: string(errdefs.ClassOf(err))}
}

func (ch *channel) signal(sig syscall.Signal) {
	ch.mu.Lock()
	p, k := ch.proc, ch.kept
	ch.mu.Unlock()
	if p == nil && k != nil {
		p = k.running() // an attach's command
	}
	if p != nil {
		_ = p.Signal(sig)
	}
}

// detach lets the channel's process run on with nobody listening: its
// output is drained and dropped, its stdin closed.
func (ch *channel) detach() {
	if ch.keptChannel() {
		ch.mu.Lock()
		ch.quiesced = true
		ch.mu.Unlock()
		ch.detachKept() // its output is kept for the next attach
		return
	}
	err := errors.New("detached for a snapshot")
	ch.mu.Lock()
	sock := ch.sock
	ch.mu.Unlock()
	if sock != nil {
		sock.Close() // a connection has nobody to talk to after the snapshot
	}
	ch.stdout.Abort(err)
	ch.stderr.Abort(err)
	if ch.stdin != nil {
		ch.stdin.CloseWithError(io.EOF)
	}
}

// abort kills the channel's process group and unblocks its streams.
//
// A channel following a kept command detaches from it instead: the
// command runs on (its host went away, or closed the channel).
func (ch *channel) abort() {
	if ch.keptChannel() {
		ch.mu.Lock()
		ch.aborted = true
		ch.mu.Unlock()
		ch.detachKept()
		return
	}
	ch.mu.Lock()
	ch.aborted = true
	p := ch.proc
	sock := ch.sock
	ch.mu.Unlock()
	if p != nil {
		_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
	}
	if sock != nil {
		sock.Close()
	}
	err := errors.New("channel closed by host")
	ch.stdout.Abort(err)
	ch.stderr.Abort(err)
	if ch.stdin != nil {
		ch.stdin.CloseWithError(err)
	}
}

// drainGrace bounds how long exec keeps reading output after the process
// exited and all it wrote was read: a background child that inherited
// stdout would otherwise hold the call open for as long as it lives.
const drainGrace = 100 * time.Millisecond

func (ch *channel) exec(ctx context.Context) wire.ExitMsg {
	if len(ch.req.Argv) == 0 {
		return errExit(errdefs.New(errdefs.InvalidArgument, "empty command"))
	}
	// Built by hand, not with exec.Command, which would search the agent's
	// PATH: the exec's own PATH counts, and every stat is a round trip to
	// the sandbox's file server.
	// The request's user (with its login environment and home) or the
	// image's (with neither, as before).
	var user *account
	env := ch.s.a.execEnv(nil)
	if ch.req.User != "" {
		u, err := resolveUser(ch.s.a.accounts(), ch.req.User)
		if err != nil {
			return errExit(err) // never ran: the host turns it into an error
		}
		user = u
		env = wire.MergeEnv(env, u.env(), ch.req.Env)
	} else {
		env = wire.MergeEnv(env, ch.req.Env)
		if spec := ch.s.a.cfg.User; spec != "" {
			u, err := resolveUser(ch.s.a.accounts(), spec)
			if err != nil {
				return wire.ExitMsg{Code: 126, Error: "the image's " + err.Error(), ErrorClass: string(errdefs.InvalidArgument)}
			}
			user = u
		}
	}
	// Built by hand, not with exec.Command, which would search the agent's
	// PATH: the exec's own PATH counts, and every stat is a round trip to
	// the sandbox's file server.
	cmd := &exec.Cmd{Path: ch.req.Argv[0], Args: ch.req.Argv, Env: env, Dir: ch.req.Dir}
	if !strings.Contains(cmd.Path, "/") {
		p, err := lookPath(cmd.Path, envValue(cmd.Env, "PATH"))
		if err != nil {
			return wire.ExitMsg{Code: 127, Error: err.Error(), ErrorClass: string(errdefs.NotFound)}
		}
		cmd.Path = p
	}
	if cmd.Dir == "" {
		cmd.Dir = "/"
		if d := ch.s.a.cfg.Workdir; d != "" {
			if fi, err := os.Stat(d); err == nil && fi.IsDir() {
				cmd.Dir = d
			}
		}
		if ch.req.User != "" {
			if d := userDir(user); d != "" {
				cmd.Dir = d
			}
		}
	} else if fi, err := os.Stat(cmd.Dir); err != nil || !fi.IsDir() {
		return wire.ExitMsg{Code: 126, Error: "working directory " + ch.req.Dir + " does not exist or is not a directory", ErrorClass: string(errdefs.InvalidArgument)}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if user != nil {
		cmd.SysProcAttr.Credential = user.cred()
	}
	var reserved bool
	if ch.req.TTY {
		if ch.req.Keep {
			return errExit(errdefs.New(errdefs.InvalidArgument, "a command on a terminal cannot be kept: run it without keep"))
		}
		return ch.execTTY(cmd)
	}
	if ch.req.Keep {
		if len(ch.req.Tag) > wire.MaxTag {
			return errExit(errdefs.New(errdefs.InvalidArgument, "tag of %d bytes: at most %d", len(ch.req.Tag), wire.MaxTag))
		}
		if err := ch.s.a.reserveKept(); err != nil {
			return errExit(err)
		}
		// Released here unless the command runs (execKept registers it).
		reserved = true
		defer func() {
			if reserved {
				ch.s.a.addKept(nil)
			}
		}()
	}

	outR, outW, err := os.Pipe()
	if err != nil {
		return errExit(err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return errExit(err)
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	var inW *os.File
	if ch.stdin != nil {
		var inR *os.File
		if inR, inW, err = os.Pipe(); err != nil {
			outR.Close()
			outW.Close()
			errR.Close()
			errW.Close()
			return errExit(err)
		}
		cmd.Stdin = inR
		defer inR.Close()
	}
	wait, err := ch.s.a.reaper.start(func() (int, error) {
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		return cmd.Process.Pid, nil
	})
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		if inW != nil {
			inW.Close()
		}
		return startFailed(err)
	}
	ch.mu.Lock()
	ch.proc = cmd.Process
	aborted := ch.aborted
	ch.mu.Unlock()
	pid := cmd.Process.Pid
	if ch.req.Keep {
		reserved = false
		k, att := ch.newKept(cmd.Process, inW)
		started, _ := json.Marshal(wire.StartedMsg{PID: pid})
		_ = ch.s.conn.Write(wire.Started, ch.id, started)
		return ch.execKept(k, att, wait, outR, errR)
	}
	if aborted {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	started, _ := json.Marshal(wire.StartedMsg{PID: pid})
	_ = ch.s.conn.Write(wire.Started, ch.id, started)

	if inW != nil {
		go func() {
			_, _ = io.Copy(inW, ch.stdin)
			inW.Close()
		}()
	}
	var pumps sync.WaitGroup
	pumps.Add(2)
	out, errp := newOutPump(ch.stdout, outR), newOutPump(ch.stderr, errR)
	go out.run(&pumps)
	go errp.run(&pumps)

	return ch.waitExit(wait, pid, &pumps, []*outPump{out, errp}, func() {
		outR.Close()
		errR.Close()
	})
}

// waitExit waits for the process pid (killing its group on the request's
// timeout), then for its output pumps: until they end, or until each has
// read all the process wrote before it exited and drainGrace passed (a
// background child may hold the pipes), or has waited drainGrace for
// output that does not come. It returns the exit. closeOut stops the
// pumps (it is called once, in any case).
func (ch *channel) waitExit(wait <-chan syscall.WaitStatus, pid int, pumps *sync.WaitGroup, outs []*outPump, closeOut func()) wire.ExitMsg {
	var timeout <-chan time.Time
	if ch.req.TimeoutMS > 0 {
		t := time.NewTimer(time.Duration(ch.req.TimeoutMS) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	var ws syscall.WaitStatus
	timedOut := false
	select {
	case ws = <-wait:
	case <-timeout:
		timedOut = true
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		ws = <-wait
	}
	if timedOut {
		// The whole tree was killed: the pipes close once its last member dies.
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	for _, o := range outs {
		o.exited()
	}
	pumpsDone := make(chan struct{})
	go func() { pumps.Wait(); close(pumpsDone) }()
	// Output still on its way to a slow host is not cut off: a pump held
	// up by the host's window has not read the pipe to its end yet.
	tick := time.NewTicker(drainGrace / 4)
	defer tick.Stop()
wait:
	for {
		select {
		case <-pumpsDone:
			break wait
		case now := <-tick.C:
			done := true
			for _, o := range outs {
				done = o.settled(now) && done
			}
			if done {
				// Background processes still hold the pipes; stop reading them.
				closeOut()
				<-pumpsDone
				break wait
			}
		}
	}
	closeOut()
	exit := wire.ExitMsg{TimedOut: timedOut}
	switch {
	case ws.Signaled():
		exit.Signal = int(ws.Signal())
		exit.Code = 128 + exit.Signal
	default:
		exit.Code = ws.ExitStatus()
	}
	return exit
}

// outPump copies one output pipe (or terminal) of a process to the host,
// keeping track of whether it has read all the process wrote before it
// exited.
type outPump struct {
	w io.Writer
	r *os.File

	mu sync.Mutex
	// gone: the process exited. drainedAt: when a read begun after that
	// came back short (the pipe was empty then: what the process wrote
	// is read). reads counts reads begun; reading: one is under way, since
	// blockedSince (as seen by settled).
	gone         bool
	drainedAt    time.Time
	reads        uint64
	reading      bool
	seenReads    uint64
	blockedSince time.Time
}

func newOutPump(w io.Writer, r *os.File) *outPump { return &outPump{w: w, r: r} }

// exited says the process exited.
func (p *outPump) exited() {
	p.mu.Lock()
	p.gone = true
	p.mu.Unlock()
}

// settled reports whether the pump may be stopped at now: all the process
// wrote was read drainGrace ago, or one read has waited for nothing that
// long.
func (p *outPump) settled(now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.drainedAt.IsZero() && now.Sub(p.drainedAt) >= drainGrace {
		return true
	}
	if !p.reading {
		p.blockedSince = time.Time{} // writing to the host, or between reads
		return false
	}
	if p.blockedSince.IsZero() || p.seenReads != p.reads {
		p.seenReads, p.blockedSince = p.reads, now
		return false
	}
	return now.Sub(p.blockedSince) >= drainGrace
}

func (p *outPump) run(wg *sync.WaitGroup) {
	defer wg.Done()
	buf := make([]byte, wire.ChunkSize)
	w := p.w
	for {
		p.mu.Lock()
		after := p.gone
		p.reads++
		p.reading = true
		p.mu.Unlock()
		n, err := p.r.Read(buf)
		p.mu.Lock()
		p.reading = false
		if after && (n < len(buf) || err != nil) && p.drainedAt.IsZero() {
			p.drainedAt = time.Now()
		}
		p.mu.Unlock()
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				// The host went away: keep draining so the process is not
				// blocked on a full pipe.
				w = io.Discard
			}
		}
		if err != nil {
			return
		}
	}
}

// startFailed is the exit of a command that could not start: 127 when it
// does not exist, else 126, as a shell says, with the path and the reason
// (not Go's "fork/exec PATH: permission denied").
func startFailed(err error) wire.ExitMsg {
	if errors.Is(err, fs.ErrNotExist) {
		return wire.ExitMsg{Code: 127, Error: err.Error(), ErrorClass: string(errdefs.NotFound)}
	}
	msg := err.Error()
	var pe *fs.PathError
	if errors.As(err, &pe) {
		msg = pe.Path + ": " + pe.Err.Error()
		switch {
		case errors.Is(pe.Err, syscall.EACCES):
			msg += " (not an executable file)"
		case errors.Is(pe.Err, syscall.ENOEXEC):
			msg += " (neither a binary nor a script starting with #!)"
		}
	}
	return wire.ExitMsg{Code: 126, Error: msg, ErrorClass: string(errdefs.InvalidArgument)}
}

func envValue(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}

func lookPath(file, path string) (string, error) {
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, file)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New(file + ": command not found")
}

func (ch *channel) tarGet() wire.ExitMsg {
	var skip func(string) bool
	if len(ch.req.Exclude) > 0 {
		skip = func(rel string) bool {
			p := filepath.Join(ch.req.Path, rel)
			for _, ex := range ch.req.Exclude {
				if p == ex {
					return true
				}
			}
			return false
		}
	}
	if ok, err := ch.tarGeneratedFile(); ok || err != nil {
		if err != nil {
			return errExit(err)
		}
		return wire.ExitMsg{}
	}
	// Buffered: the tar writer writes each header and file on its own,
	// and every write would be a frame and a flush (three per small file).
	bw := bufio.NewWriterSize(ch.stdout, wire.ChunkSize)
	err := tarx.CreateFiltered(bw, ch.req.Path, filepath.Base(ch.req.Path), skip)
	if ferr := bw.Flush(); err == nil {
		err = ferr
	}
	if err != nil {
		return errExit(err)
	}
	return wire.ExitMsg{}
}

// maxGenerated bounds the content read of a file whose size the kernel
// reports as 0 (a /proc or /sys file).
const maxGenerated = 4 << 20

// tarGeneratedFile sends a regular file whose stat size is 0 (a /proc or
// /sys file, made when read) with the content it reads, which a tar of its
// stat size would lose. It reports false for any other path.
func (ch *channel) tarGeneratedFile() (bool, error) {
	fi, err := os.Lstat(ch.req.Path)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != 0 {
		return false, nil
	}
	f, err := os.Open(ch.req.Path)
	if err != nil {
		return false, nil // let the tar walker report it
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxGenerated+1))
	if err != nil {
		return true, fmt.Errorf("read %s: %w", ch.req.Path, err)
	}
	if len(b) > maxGenerated {
		return true, errdefs.New(errdefs.ResourceExhausted, "%s: a generated file over %d MiB", ch.req.Path, maxGenerated>>20)
	}
	hdr, err := tar.FileInfoHeader(fi, "")
	if err != nil {
		return true, err
	}
	hdr.Name, hdr.Size = filepath.Base(ch.req.Path), int64(len(b))
	tw := tar.NewWriter(ch.stdout)
	if err := tw.WriteHeader(hdr); err != nil {
		return true, err
	}
	if _, err := tw.Write(b); err != nil {
		return true, err
	}
	return true, tw.Close()
}

func (ch *channel) tarPut() wire.ExitMsg {
	if ch.stdin == nil {
		return errExit(errdefs.New(errdefs.InvalidArgument, "tar-put needs stdin"))
	}
	if ch.req.Through {
		err := writeThrough(ch.s.a.accounts(), ch.req.Path, ch.req.User, ch.stdin)
		_, _ = io.Copy(io.Discard, ch.stdin)
		if err != nil {
			return errExit(err)
		}
		return wire.ExitMsg{}
	}
	// Entries are counted as they come, each before it is extracted. A
	// symlink at the destination is followed: inside the sandbox it can
	// only lead to the sandbox's own files.
	opts := tarx.Options{Chown: true, FollowDest: true}
	if ch.req.User != "" {
		u, err := resolveUser(ch.s.a.accounts(), ch.req.User)
		if err != nil {
			return errExit(err)
		}
		opts.Owner = &tarx.Owner{UID: int(u.UID), GID: int(u.GID)}
	}
	limit := maxUploadEntries(memTotal("/proc/meminfo"))
	var limitErr error
	opts.Limit = func(n int) error {
		if n <= limit {
			return nil
		}
		limitErr = errdefs.New(errdefs.ResourceExhausted,
			"upload stopped at entry %d: a sandbox of %d MiB takes at most %d files per copy, as each costs it memory (what was extracted so far stays); copy an archive and unpack it with tar inside, copy in parts, or give the sandbox more memory",
			n, int64(limit)*bytesPerEntry>>20, limit)
		return limitErr
	}
	err := tarx.ExtractTo(ch.req.Path, ch.stdin, opts)
	if limitErr == nil {
		// Drain what the host still sends so it does not block on its
		// window. An upload over the limit is not read to its end: the
		// host stops sending at the exit.
		_, _ = io.Copy(io.Discard, ch.stdin)
	}
	if err != nil {
		return errExit(err)
	}
	return wire.ExitMsg{}
}

// bytesPerEntry is what one extracted file is allowed to cost the sandbox:
// each costs the sandbox kernel memory that its own /proc/meminfo does not
// show (60,000 empty files exhaust 128 MiB under gVisor), so an upload's
// entries are bounded by the sandbox's size instead.
const bytesPerEntry = 16 << 10

// maxUploadEntries is how many entries one upload may hold in a sandbox of
// total bytes of memory (16,384 per 256 MiB).
func maxUploadEntries(total int64) int {
	if total <= 0 {
		total = 128 << 20
	}
	return int(total / bytesPerEntry)
}

// memTotal returns the sandbox's MemTotal in bytes, or 0.
func memTotal(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			v, _ := strconv.ParseInt(f[1], 10, 64)
			return v << 10
		}
	}
	return 0
}

func (ch *channel) stat() wire.ExitMsg {
	var st wire.StatInfo
	if fi, err := os.Lstat(ch.req.Path); err == nil {
		st = wire.StatInfo{Exists: true, IsDir: fi.IsDir()}
	}
	b, _ := json.Marshal(st)
	return wire.ExitMsg{Info: b}
}

// dialTimeout bounds a connect to a port inside the sandbox.
const dialTimeout = 10 * time.Second

// dial connects to 127.0.0.1:Port and pipes the channel's stdin to the
// socket and the socket to stdout, each way under the streams' flow
// control. Each direction's end is passed on as a half-close; the channel
// ends once both directions have (or on abort).
func (ch *channel) dial() wire.ExitMsg {
	if ch.stdin == nil {
		return errExit(errdefs.New(errdefs.InvalidArgument, "dial needs stdin"))
	}
	port := ch.req.Port
	if port < 1 || port > 65535 {
		return errExit(errdefs.New(errdefs.InvalidArgument, "port %d is out of range: use 1 to 65535", port))
	}
	c, err := (&net.Dialer{Timeout: dialTimeout}).Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return errExit(errdefs.New(errdefs.Unavailable, "nothing listens on port %d inside the sandbox (connection refused)", port))
		}
		return errExit(errdefs.New(errdefs.Unavailable, "connect to port %d inside the sandbox: %v", port, err))
	}
	defer c.Close()
	tc := c.(*net.TCPConn)
	ch.mu.Lock()
	if ch.aborted {
		ch.mu.Unlock()
		return errExit(errors.New("channel closed by host"))
	}
	ch.sock = c
	ch.mu.Unlock()
	started, _ := json.Marshal(wire.StartedMsg{})
	_ = ch.s.conn.Write(wire.Started, ch.id, started)

	toSock := make(chan struct{})
	go func() {
		defer close(toSock)
		if _, err := io.Copy(tc, ch.stdin); err != nil {
			tc.Close() // reset, or the host gave up: the other way ends too
			return
		}
		_ = tc.CloseWrite()
	}()
	buf := make([]byte, wire.ChunkSize)
	if _, err := io.CopyBuffer(struct{ io.Writer }{ch.stdout}, tc, buf); err != nil {
		tc.Close()
		ch.stdin.CloseWithError(err)
	} else {
		_ = ch.stdout.Close()
	}
	<-toSock
	return wire.ExitMsg{}
}

func (ch *channel) identity() wire.ExitMsg {
	if ch.req.SecretEnv != nil {
		a := ch.s.a
		a.mu.Lock()
		a.secretEnv = slices.Clone(ch.req.SecretEnv)
		a.mu.Unlock()
	}
	if ch.req.Hostname != "" {
		if err := syscall.Sethostname([]byte(ch.req.Hostname)); err != nil {
			return errExit(fmt.Errorf("sethostname: %w", err))
		}
		a := ch.s.a
		a.mu.Lock()
		a.hostEnv = []string{"HOSTNAME=" + ch.req.Hostname}
		a.mu.Unlock()
		a.renameHostFiles(ch.req.Hostname)
	}
	if ch.req.ClockNS != 0 {
		tv := syscall.NsecToTimeval(ch.req.ClockNS)
		if err := syscall.Settimeofday(&tv); err != nil {
			return errExit(fmt.Errorf("set the clock: %w", err))
		}
	}
	if len(ch.req.Seed) > 0 {
		if err := reseed(ch.req.Seed); err != nil {
			return errExit(fmt.Errorf("reseed: %w", err))
		}
	}
	return wire.ExitMsg{}
}
