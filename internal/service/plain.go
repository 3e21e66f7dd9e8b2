package service

import "context"

// plainKey marks a context whose Exec caller never signals, resizes or
// writes stdin to the process (see Plain).
type plainKey struct{}

// Plain returns ctx marked for an Exec whose caller only reads the
// process's output and its end: it never calls Signal or Resize and sets
// no Stdin. A service that reaches the sandbox over the network (remote)
// may then run it as a plain request on a kept-alive connection instead
// of a two-way stream on a connection of its own.
func Plain(ctx context.Context) context.Context { return context.WithValue(ctx, plainKey{}, true) }

// IsPlain reports whether ctx was marked by Plain.
func IsPlain(ctx context.Context) bool {
	v, _ := ctx.Value(plainKey{}).(bool)
	return v
}
