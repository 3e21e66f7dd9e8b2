package guest

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"path"
	"strings"

	"github.com/clade-sandbox/clade/internal/agent/wire"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// WatchEvent is a change inside a watched directory (see Conn.Watch).
type WatchEvent = wire.WatchEvent

// Watch follows changes under the directory path (absolute) inside the
// sandbox, below it too with recursive, by the agent's inotify. It
// returns once the watch is armed: a change made after it is reported.
// An agent without watches (an older clade's) is an InvalidArgument
// error that says so.
func (c *Conn) Watch(ctx context.Context, p string, recursive bool) (*Watch, error) {
	if _, err := c.session(ctx); err != nil {
		return nil, err
	}
	if !c.hasFeature(wire.FeatureWatch) {
		return nil, errdefs.New(errdefs.InvalidArgument, "the sandbox's agent has no directory watches (it predates them: recreate the sandbox)")
	}
	ch, err := c.openStarted(ctx, wire.Request{Op: wire.OpWatch, Path: p, Recursive: recursive},
		errdefs.New(errdefs.Internal, "watch %s: the agent ended the watch at once", p))
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(ch.stdout)
	sc.Buffer(make([]byte, 4096), wire.MaxWatchLine)
	return &Watch{ch: ch, sc: sc, ctx: ctx}, nil
}

// Watch is a running watch (Conn.Watch).
type Watch struct {
	ch  *call
	sc  *bufio.Scanner
	ctx context.Context
}

// Next waits for the next change. Its error ends the watch: io.EOF for
// one that ended without error, else why (the directory removed, the
// sandbox gone). What the agent sends is checked: a line that is not an
// event of a known kind with a clean relative name ends the watch.
func (w *Watch) Next() (WatchEvent, error) {
	if !w.sc.Scan() {
		if err := w.sc.Err(); err != nil {
			return WatchEvent{}, errdefs.New(errdefs.Internal, "watch: the agent sent a bad event: %v", err)
		}
		exit, err := w.ch.wait(w.ctx)
		if err == nil {
			err = exitError(exit)
		}
		if err == nil {
			err = io.EOF
		}
		return WatchEvent{}, err
	}
	var ev WatchEvent
	if err := json.Unmarshal(w.sc.Bytes(), &ev); err != nil {
		return WatchEvent{}, errdefs.New(errdefs.Internal, "watch: the agent sent a bad event: %v", err)
	}
	if err := checkEvent(ev); err != nil {
		return WatchEvent{}, err
	}
	return ev, nil
}

func checkEvent(ev WatchEvent) error {
	switch ev.Op {
	case "create", "write", "remove", "rename", "chmod":
	default:
		return errdefs.New(errdefs.Internal, "watch: the agent sent an event of unknown kind %.32q", ev.Op)
	}
	n := ev.Name
	if n == "" || strings.ContainsRune(n, 0) || path.IsAbs(n) || path.Clean(n) != n || n == ".." || strings.HasPrefix(n, "../") {
		return errdefs.New(errdefs.Internal, "watch: the agent sent a bad name %.64q", n)
	}
	return nil
}

// Close ends the watch.
func (w *Watch) Close() { w.ch.close() }
