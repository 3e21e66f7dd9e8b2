package store

import (
	"path/filepath"
	"testing"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// TestTransitionAll: every sandbox moves, or none does when one is not in
// the state the move starts from.
func TestTransitionAll(t *testing.T) {
	ctx := t.Context()
	st, err := Open(ctx, filepath.Join(t.TempDir(), "clade.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, id := range []string{"a", "b", "c"} {
		if err := st.InsertSandbox(ctx, Sandbox{ID: id, Image: "img", State: StateCreating, MemoryMiB: 64, CPUs: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Transition(ctx, "c", StateCreating, StateRunning, ""); err != nil {
		t.Fatal(err)
	}
	state := func(id string) string {
		sb, err := st.GetSandbox(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return sb.State
	}
	if err := st.TransitionAll(ctx, []string{"a", "b", "c"}, StateCreating, StateRunning); !errdefs.Is(err, errdefs.Conflict) {
		t.Fatalf("a move with one sandbox in another state: %v, want a conflict", err)
	}
	if state("a") != StateCreating || state("b") != StateCreating {
		t.Fatalf("after a refused move: a %s, b %s; want both still creating", state("a"), state("b"))
	}
	if err := st.TransitionAll(ctx, []string{"a", "b"}, StateCreating, StateRunning); err != nil {
		t.Fatal(err)
	}
	if state("a") != StateRunning || state("b") != StateRunning {
		t.Fatalf("after the move: a %s, b %s; want both running", state("a"), state("b"))
	}
}
