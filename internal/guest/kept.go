package guest

import (
	"context"
	"encoding/json"
	"io"

	"github.com/clade-sandbox/clade/internal/agent/wire"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// maxKeptList bounds the agent's answer to Kept (hostile bytes): MaxKept
// running and MaxKeptEnded ended commands with their argv and tags fit
// far below it.
const maxKeptList = 32 << 20

// KeptCommand is a command started with ExecRequest.Keep that the agent
// still holds: running, or ended with its exit not yet collected.
type KeptCommand = wire.KeptCommand

// checkKeep checks ExecRequest.Keep and Tag and says whether the agent
// keeps the process (false for an agent without wire.FeatureKeep).
func (c *Conn) checkKeep(ctx context.Context, req ExecRequest) (bool, string, error) {
	if !req.Keep {
		if req.Tag != "" {
			return false, "", errdefs.New(errdefs.InvalidArgument, "a tag labels a kept command: set keep too, or leave the tag out")
		}
		return false, "", nil
	}
	if req.TTY {
		return false, "", errdefs.New(errdefs.InvalidArgument, "a command on a terminal cannot be kept: run it without keep")
	}
	if len(req.Tag) > wire.MaxTag {
		return false, "", errdefs.New(errdefs.InvalidArgument, "tag of %d bytes: at most %d", len(req.Tag), wire.MaxTag)
	}
	if _, err := c.session(ctx); err != nil {
		return false, "", err
	}
	if !c.hasFeature(wire.FeatureKeep) {
		return false, "", nil
	}
	return true, req.Tag, nil
}

// errNoKeep refuses Kept and Attach on an agent that keeps no commands.
func errNoKeep() error {
	return errdefs.New(errdefs.InvalidArgument, "this sandbox's agent predates kept commands (it was made by an older clade, or restored from a snapshot of one)")
}

// Kept lists the agent's kept commands, by pid.
func (c *Conn) Kept(ctx context.Context) ([]KeptCommand, error) {
	if _, err := c.session(ctx); err != nil {
		return nil, err
	}
	if !c.hasFeature(wire.FeatureKeep) {
		return nil, errNoKeep()
	}
	ch, err := c.open(ctx, wire.Request{Op: wire.OpKept})
	if err != nil {
		return nil, err
	}
	defer ch.close()
	b, err := io.ReadAll(io.LimitReader(ch.stdout, maxKeptList+1))
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, err)
	}
	if len(b) > maxKeptList {
		return nil, errdefs.New(errdefs.Internal, "the agent's list of kept commands passed %d MiB", maxKeptList>>20)
	}
	exit, err := ch.wait(ctx)
	if err != nil {
		return nil, err
	}
	if err := exitError(exit); err != nil {
		return nil, err
	}
	var out []KeptCommand
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, errdefs.New(errdefs.Internal, "the agent's list of kept commands: %v", err)
	}
	return out, nil
}

// Attach follows the kept command pid: its Stdout and Stderr replay the
// output it made while detached (a note on Stderr first if some was
// dropped), then stream the rest, and Wait gives its exit, which is then
// collected (a later Attach finds nothing). Stdin makes Process.Stdin
// write to its stdin (closing it ends the command's stdin). Close
// detaches again. A newer Attach takes the command over: this Process
// then ends with an error exit. A pid the agent does not keep is
// NotFound.
func (c *Conn) Attach(ctx context.Context, pid int, stdin bool) (*Process, error) {
	if pid <= 0 {
		return nil, errdefs.New(errdefs.InvalidArgument, "pid %d: give the pid of a kept command", pid)
	}
	if _, err := c.session(ctx); err != nil {
		return nil, err
	}
	if !c.hasFeature(wire.FeatureKeep) {
		return nil, errNoKeep()
	}
	ch, err := c.open(ctx, wire.Request{Op: wire.OpAttach, PID: pid, Stdin: stdin})
	if err != nil {
		return nil, err
	}
	if err := ch.waitStarted(ctx); err != nil {
		ch.close()
		return nil, err
	}
	// Started first: an attach to a command that has ended is started and
	// done by the time we look, and a select between the two would pick
	// either.
	select {
	case <-ch.started:
	default:
		<-ch.done
		if ch.err != nil {
			return nil, ch.err
		}
		if err := exitError(ch.exit); err != nil {
			return nil, err
		}
		return nil, errdefs.New(errdefs.Internal, "the agent ended the attach to %d without starting it", pid)
	}
	p := &Process{ch: ch, Stdout: ch.stdout, Stderr: ch.stderr}
	if ch.stdin != nil {
		p.Stdin = ch.stdin
	}
	return p, nil
}
