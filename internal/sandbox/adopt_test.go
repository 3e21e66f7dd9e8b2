package sandbox

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/store"
)

// TestSandboxFile: a sleep image's description round-trips the whole
// record, and one that came from another node is checked as input: a
// missing, unreadable, foreign or nonsensical description is a Conflict
// that says so, never a record.
func TestSandboxFile(t *testing.T) {
	dir := t.TempDir()
	rec := store.Sandbox{ID: "0123456789abcdef", Name: "web", Image: "default", MemoryMiB: 256, CPUs: 1, Env: []string{"K=V"},
		Opts: store.Options{TrafficToken: "tok", Labels: map[string]string{"a": "b"}, IdleSleepMS: 5000, Network: &store.NetworkOptions{Mode: "none"}}}
	if _, _, err := readSandboxFile(dir, rec.ID); !errdefs.Is(err, errdefs.Conflict) {
		t.Fatalf("no description = %v, want Conflict", err)
	}
	root := RootID(image.Image{Name: "default"})
	if err := writeSandboxFile(dir, rec, root); err != nil {
		t.Fatal(err)
	}
	got, gotRoot, err := readSandboxFile(dir, rec.ID)
	if err != nil || gotRoot != root || got.Name != "web" || got.Opts.TrafficToken != "tok" || got.Env[0] != "K=V" || got.Opts.Network.Mode != "none" || got.Opts.IdleSleepMS != 5000 {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	if _, _, err := readSandboxFile(dir, "fedcba9876543210"); !errdefs.Is(err, errdefs.Conflict) {
		t.Fatalf("a description of another sandbox = %v, want Conflict", err)
	}
	for name, body := range map[string]string{
		"not json":   "{",
		"version 2":  `{"version":2,"sandbox":{"ID":"0123456789abcdef","Image":"default","MemoryMiB":256}}`,
		"no image":   `{"version":1,"sandbox":{"ID":"0123456789abcdef","MemoryMiB":256}}`,
		"no memory":  `{"version":1,"sandbox":{"ID":"0123456789abcdef","Image":"default"}}`,
		"neg cpus":   `{"version":1,"sandbox":{"ID":"0123456789abcdef","Image":"default","MemoryMiB":256,"CPUs":-1}}`,
		"bad image":  `{"version":1,"sandbox":{"ID":"0123456789abcdef","Image":"a\nb","MemoryMiB":256}}`,
		"other id":   `{"version":1,"sandbox":{"ID":"../../etc","Image":"default","MemoryMiB":256}}`,
		"only a nul": "\x00",
		"bad root":   `{"version":1,"sandbox":{"ID":"0123456789abcdef","Image":"default","MemoryMiB":256},"root":"../../x"}`,
	} {
		if err := os.WriteFile(filepath.Join(dir, sandboxFile), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, err := readSandboxFile(dir, rec.ID); !errdefs.Is(err, errdefs.Conflict) {
			t.Errorf("%s: %v, want Conflict", name, err)
		}
	}
	// Volumes and secrets are each node's own: such a sandbox cannot move.
	if movable(store.Sandbox{ID: "x", Opts: store.Options{Volumes: []store.VolumeMount{{}}}}) == nil ||
		movable(store.Sandbox{ID: "x", Opts: store.Options{Secrets: []store.SecretRef{{}}}}) == nil || movable(rec) != nil {
		t.Fatal("movable: volumes and secrets must stay, a plain sandbox may move")
	}
}
