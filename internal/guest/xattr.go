package guest

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/clade-sandbox/clade/internal/agent/wire"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// errNoXattr is the error for an agent without extended attributes.
func errNoXattr() error {
	return errdefs.New(errdefs.InvalidArgument, "the sandbox's agent keeps no file attributes (it predates them: recreate the sandbox)")
}

// Xattrs reads the extended attributes named prefix+KEY (prefix in the
// user. namespace) of each of paths (absolute, clean), not following a
// final symlink: one KEY -> value map per path, nil where the path has
// none, is missing, or holds more than wire.MaxXattrBytes of them. An
// agent without them (an older clade's) is an InvalidArgument error; with
// no paths, Xattrs only checks the agent keeps them.
func (c *Conn) Xattrs(ctx context.Context, prefix string, paths []string) ([]map[string]string, error) {
	if _, err := c.session(ctx); err != nil {
		return nil, err
	}
	if !c.hasFeature(wire.FeatureXattr) {
		return nil, errNoXattr()
	}
	out := make([]map[string]string, 0, len(paths))
	for len(paths) > 0 {
		batch := paths[:min(len(paths), wire.MaxXattrPaths)]
		paths = paths[len(batch):]
		exit, err := c.run(ctx, wire.Request{Op: wire.OpXattrGet, Paths: batch, XattrPrefix: prefix})
		if err != nil {
			return nil, err
		}
		var got []map[string]string
		if err := json.Unmarshal(exit.Info, &got); err != nil || len(got) != len(batch) {
			return nil, errdefs.New(errdefs.Internal, "xattrs: the agent sent a bad answer (%d entries for %d paths): %v", len(got), len(batch), err)
		}
		for _, m := range got {
			n := 0
			for k, v := range m {
				n += len(prefix) + len(k) + len(v)
			}
			if n > wire.MaxXattrBytes {
				return nil, errdefs.New(errdefs.Internal, "xattrs: the agent sent %d bytes of attributes for one path", n)
			}
		}
		out = append(out, got...)
	}
	return out, nil
}

// SetXattrs replaces the extended attributes named prefix+KEY of path
// (absolute, clean; not following a final symlink) with attrs: those not
// in it are removed. A missing path is NotFound.
func (c *Conn) SetXattrs(ctx context.Context, path, prefix string, attrs map[string]string) error {
	if _, err := c.session(ctx); err != nil {
		return err
	}
	if !c.hasFeature(wire.FeatureXattr) {
		return errNoXattr()
	}
	if attrs == nil {
		attrs = map[string]string{}
	}
	_, err := c.run(ctx, wire.Request{Op: wire.OpXattrSet, Path: path, XattrPrefix: prefix, Xattrs: attrs})
	return err
}

// run opens a channel for req, waits for its end and returns its exit,
// or its error.
func (c *Conn) run(ctx context.Context, req wire.Request) (wire.ExitMsg, error) {
	ch, err := c.open(ctx, req)
	if err != nil {
		return wire.ExitMsg{}, err
	}
	exit, err := ch.wait(ctx)
	if err != nil {
		return wire.ExitMsg{}, err
	}
	if err := exitError(exit); err != nil {
		return wire.ExitMsg{}, fmt.Errorf("%s: %w", req.Op, err)
	}
	return exit, nil
}

// SupportsKillAll reports whether the agent serves KillAll. It waits for
// the agent's session as a request would; false when there is none.
func (c *Conn) SupportsKillAll(ctx context.Context) bool {
	if _, err := c.session(ctx); err != nil {
		return false
	}
	return c.hasFeature(wire.FeatureKillAll)
}

// KillAll has the agent kill every process of the sandbox but itself,
// until none is left (wire.OpKillAll).
func (c *Conn) KillAll(ctx context.Context) error {
	if !c.SupportsKillAll(ctx) {
		return errdefs.New(errdefs.InvalidArgument, "the sandbox's agent cannot kill its processes (it predates that)")
	}
	_, err := c.run(ctx, wire.Request{Op: wire.OpKillAll})
	return err
}
