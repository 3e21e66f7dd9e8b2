package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/clade-sandbox/clade/internal/agent/wire"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// Kept commands (wire.Request.Keep): a process that outlives the channel
// that started it. Its output pumps write into the command's buffer, never
// to a channel; the channel attached to it (the one that started it, or a
// later OpAttach) forwards the buffer to the host. Without an attached
// channel the buffer keeps the newest wire.KeptBuffer bytes; with one, the
// pumps wait for the host as they would for a plain exec.

// errDetached ends an attached channel whose host went away or closed it.
var errDetached = errors.New("detached: the command runs on")

// errTakenOver ends an attached channel when a newer attach took the
// command over.
var errTakenOver = errors.New("another attach took the command over")

// keptCmd is one kept command.
type keptCmd struct {
	a    *Agent
	info wire.KeptCommand // PID, Argv, Tag, StartedMS (immutable)
	proc *os.Process

	mu   sync.Mutex
	cond *sync.Cond
	// chunks is the output not yet forwarded, oldest first; size is its
	// length in bytes; dropped counts bytes dropped since the last
	// attached channel saw the note about it.
	chunks  []keptChunk
	size    int
	dropped int64
	// att is the channel forwarding the output, nil while detached.
	att *attachment
	// stdin is the process's stdin (nil without Request.Stdin, or once
	// closed): it stays open across detaches.
	stdin *os.File
	// exit is set once the process exited and its output was read.
	exit    *wire.ExitMsg
	endedAt time.Time
}

type keptChunk struct {
	stream wire.Type
	data   []byte
}

// attachment is one channel following a kept command.
type attachment struct {
	ch   *channel
	gone bool // detached or taken over (under the command's mu)
	// writing is held while the channel sends output, so that a detach
	// returns only once nothing more goes out on it: a quiesce's own frame
	// must follow the last output the host gets.
	writing sync.Mutex
}

// keptWriter is one output stream of a kept command, for its pump.
type keptWriter struct {
	k      *keptCmd
	stream wire.Type
}

func (w keptWriter) Write(p []byte) (int, error) {
	w.k.add(w.stream, p)
	return len(p), nil
}

// add appends output. While a channel is attached and the buffer is full
// it waits for the channel to forward some (flow control as for any
// exec); while detached it drops the oldest output instead.
func (k *keptCmd) add(stream wire.Type, p []byte) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for k.att != nil && k.size > 0 && k.size+len(p) > wire.KeptBuffer {
		k.cond.Wait()
	}
	k.chunks = append(k.chunks, keptChunk{stream, bytes.Clone(p)})
	k.size += len(p)
	for k.size > wire.KeptBuffer && len(k.chunks) > 1 {
		k.dropped += int64(len(k.chunks[0].data))
		k.size -= len(k.chunks[0].data)
		k.chunks[0] = keptChunk{}
		k.chunks = k.chunks[1:]
	}
	k.cond.Broadcast()
}

// ended records the exit; the pumps have stopped.
func (k *keptCmd) ended(exit wire.ExitMsg) {
	k.mu.Lock()
	k.exit = &exit
	k.endedAt = time.Now()
	stdin := k.stdin
	k.stdin = nil
	detached := k.att == nil
	k.cond.Broadcast()
	k.mu.Unlock()
	if stdin != nil {
		stdin.Close()
	}
	if detached {
		k.a.evictKept()
	}
}

// keptTable is the agent's kept commands by pid.
type keptTable struct {
	mu   sync.Mutex
	cmds map[int]*keptCmd
	// reserved counts execs with Keep that are starting.
	reserved int
}

// reserve claims room for one more running kept command.
func (a *Agent) reserveKept() error {
	t := &a.kept
	t.mu.Lock()
	defer t.mu.Unlock()
	running := t.reserved
	for _, k := range t.cmds {
		k.mu.Lock()
		if k.exit == nil {
			running++
		}
		k.mu.Unlock()
	}
	if running >= wire.MaxKept {
		return errdefs.New(errdefs.ResourceExhausted, "%d kept commands run already, the most a sandbox keeps: end one, or run this one without keep", wire.MaxKept)
	}
	t.reserved++
	return nil
}

// addKept registers a started kept command (releasing its reservation);
// k is nil when it did not start.
func (a *Agent) addKept(k *keptCmd) {
	t := &a.kept
	t.mu.Lock()
	defer t.mu.Unlock()
	t.reserved--
	if k == nil {
		return
	}
	if t.cmds == nil {
		t.cmds = map[int]*keptCmd{}
	}
	t.cmds[k.info.PID] = k
}

// dropKept forgets k (its exit was collected).
func (a *Agent) dropKept(k *keptCmd) {
	t := &a.kept
	t.mu.Lock()
	if t.cmds[k.info.PID] == k {
		delete(t.cmds, k.info.PID)
	}
	t.mu.Unlock()
}

// evictKept forgets the commands that ended longest ago, with nobody
// attached, past wire.MaxKeptEnded.
func (a *Agent) evictKept() {
	t := &a.kept
	t.mu.Lock()
	defer t.mu.Unlock()
	var ended []*keptCmd
	for _, k := range t.cmds {
		k.mu.Lock()
		if k.exit != nil && k.att == nil {
			ended = append(ended, k)
		}
		k.mu.Unlock()
	}
	if len(ended) <= wire.MaxKeptEnded {
		return
	}
	slices.SortFunc(ended, func(x, y *keptCmd) int { return x.endedAt.Compare(y.endedAt) })
	for _, k := range ended[:len(ended)-wire.MaxKeptEnded] {
		delete(t.cmds, k.info.PID)
	}
}

func (a *Agent) findKept(pid int) *keptCmd {
	t := &a.kept
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.cmds[pid]
}

// listKept answers an OpKept: the kept commands as JSON on stdout.
func (ch *channel) listKept() wire.ExitMsg {
	t := &ch.s.a.kept
	t.mu.Lock()
	out := make([]wire.KeptCommand, 0, len(t.cmds))
	for _, k := range t.cmds {
		k.mu.Lock()
		info := k.info
		info.Stdin = k.stdin != nil
		info.Attached = k.att != nil
		if k.exit != nil {
			info.Ended, info.Exit = true, k.exit
		}
		k.mu.Unlock()
		out = append(out, info)
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(x, y wire.KeptCommand) int { return x.PID - y.PID })
	b, err := json.Marshal(out)
	if err != nil {
		return errExit(err)
	}
	if _, err := ch.stdout.Write(b); err != nil {
		return errExit(err)
	}
	return wire.ExitMsg{}
}

// attachKept answers an OpAttach.
func (ch *channel) attachKept() wire.ExitMsg {
	k := ch.s.a.findKept(ch.req.PID)
	if k == nil {
		return errExit(errdefs.New(errdefs.NotFound, "no kept command with pid %d (never kept, or its exit was collected or forgotten)", ch.req.PID))
	}
	att := &attachment{ch: ch}
	ch.mu.Lock()
	if ch.aborted {
		ch.mu.Unlock()
		return errExit(errDetached)
	}
	ch.kept, ch.att = k, att
	ch.mu.Unlock()
	// Taken over only now: a detach meanwhile (detachKept) marked att gone.
	k.mu.Lock()
	old := k.att
	if att.gone {
		old = nil
	} else {
		if old != nil {
			old.gone = true
		}
		k.att = att
	}
	k.cond.Broadcast()
	k.mu.Unlock()
	if old != nil {
		old.ch.detachStreams(errTakenOver)
		old.writing.Lock() // its last output went out before ours
		old.writing.Unlock()
	}
	started, _ := json.Marshal(wire.StartedMsg{PID: k.info.PID})
	_ = ch.s.conn.Write(wire.Started, ch.id, started)
	return ch.follow(k, att)
}

// follow forwards k's output on the channel, attached to it as att,
// until it ends (then its exit, which is collected) or the channel is
// detached.
func (ch *channel) follow(k *keptCmd, att *attachment) wire.ExitMsg {
	k.mu.Lock()
	stdin := k.stdin
	k.mu.Unlock()
	if ch.stdin != nil {
		go func() {
			if stdin == nil {
				_, _ = io.Copy(io.Discard, ch.stdin)
				return
			}
			if _, err := io.Copy(stdin, ch.stdin); err == nil {
				// The host's EOF: the command's stdin ends. A detach
				// (an error) leaves it open for the next attach.
				k.closeStdin(stdin)
			}
		}()
	}
	for {
		k.mu.Lock()
		for !att.gone && len(k.chunks) == 0 && k.dropped == 0 && k.exit == nil {
			k.cond.Wait()
		}
		switch {
		case att.gone:
			k.mu.Unlock()
			if old := k.takenOver(att); old {
				return errExit(errTakenOver)
			}
			return errExit(errDetached)
		case k.dropped > 0:
			n := k.dropped
			k.dropped = 0
			k.mu.Unlock()
			note := fmt.Sprintf("[clade: %d bytes of this command's output were dropped while no client was attached]\n", n)
			// Requeued under writing too: a newer attach waits for it.
			att.writing.Lock()
			if _, err := ch.stderr.Write([]byte(note)); err != nil {
				k.mu.Lock()
				k.dropped += n
				k.mu.Unlock()
			}
			att.writing.Unlock()
		case len(k.chunks) > 0:
			c := k.chunks[0]
			k.chunks[0] = keptChunk{}
			k.chunks = k.chunks[1:]
			k.size -= len(c.data)
			k.cond.Broadcast()
			k.mu.Unlock()
			w := ch.stdout
			if c.stream == wire.Stderr {
				w = ch.stderr
			}
			att.writing.Lock()
			if n, err := w.Write(c.data); err != nil {
				// Not sent: it goes back first in line for the next
				// attach, which waits for writing before it forwards.
				k.mu.Lock()
				k.chunks = append([]keptChunk{{c.stream, c.data[n:]}}, k.chunks...)
				k.size += len(c.data) - n
				k.mu.Unlock()
			}
			att.writing.Unlock()
		default: // ended, and all its output forwarded: the exit is collected
			exit := *k.exit
			k.att = nil
			k.mu.Unlock()
			ch.s.a.dropKept(k)
			return exit
		}
	}
}

// takenOver reports whether att was replaced by a newer attach (rather
// than detached).
func (k *keptCmd) takenOver(att *attachment) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.att != nil && k.att != att
}

// running returns the command's process while it has not exited.
func (k *keptCmd) running() *os.Process {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.exit != nil {
		return nil
	}
	return k.proc
}

func (k *keptCmd) closeStdin(f *os.File) {
	k.mu.Lock()
	if k.stdin == f {
		k.stdin = nil
	}
	k.mu.Unlock()
	f.Close()
}

// detachKept detaches the channel from its kept command, which runs on.
func (ch *channel) detachKept() {
	ch.mu.Lock()
	k, att := ch.kept, ch.att
	ch.mu.Unlock()
	if k != nil {
		k.mu.Lock()
		att.gone = true
		if k.att == att {
			k.att = nil
		}
		ended := k.exit != nil && k.att == nil
		k.cond.Broadcast()
		k.mu.Unlock()
		if ended {
			k.a.evictKept() // one more ended command nobody follows
		}
	}
	ch.detachStreams(errDetached)
	if att != nil {
		att.writing.Lock() // what it was sending has gone out (or failed)
		att.writing.Unlock()
	}
}

// detachStreams fails the channel's streams: its forwarder stops, its
// stdin copy ends with an error (which leaves the command's stdin open).
func (ch *channel) detachStreams(err error) {
	ch.stdout.Abort(err)
	ch.stderr.Abort(err)
	if ch.stdin != nil {
		ch.stdin.CloseWithError(err)
	}
}

// keptChannel reports whether the channel is (or will be) attached to a
// kept command: a Close or a lost host detaches it instead of killing.
func (ch *channel) keptChannel() bool {
	return (ch.req.Op == wire.OpExec && ch.req.Keep) || ch.req.Op == wire.OpAttach
}

// execKept runs the started process cmd of a Keep exec as a kept
// command: its output pumps write into the command's buffer, the channel
// follows it.
func (ch *channel) execKept(k *keptCmd, att *attachment, wait <-chan syscall.WaitStatus, outR, errR *os.File) wire.ExitMsg {
	pid := k.info.PID
	var pumps sync.WaitGroup
	pumps.Add(2)
	out, errp := newOutPump(keptWriter{k, wire.Stdout}, outR), newOutPump(keptWriter{k, wire.Stderr}, errR)
	go out.run(&pumps)
	go errp.run(&pumps)
	go func() {
		exit := ch.waitExit(wait, pid, &pumps, []*outPump{out, errp}, func() {
			outR.Close()
			errR.Close()
		})
		k.ended(exit)
	}()
	return ch.follow(k, att)
}

// newKept registers the started process of a Keep exec as a kept command
// followed by the channel (before the host learns it started, so that it
// is listed and attachable at once).
func (ch *channel) newKept(proc *os.Process, inW *os.File) (*keptCmd, *attachment) {
	k := &keptCmd{a: ch.s.a, proc: proc, stdin: inW, info: wire.KeptCommand{PID: proc.Pid, Argv: ch.req.Argv, Tag: ch.req.Tag,
		StartedMS: time.Now().UnixMilli()}}
	k.cond = sync.NewCond(&k.mu)
	att := &attachment{ch: ch}
	ch.mu.Lock()
	ch.kept, ch.att = k, att
	if ch.aborted {
		att.gone = true // closed by the host already: detached from the start
	} else {
		k.att = att
	}
	ch.mu.Unlock()
	ch.s.a.addKept(k)
	return k, att
}
