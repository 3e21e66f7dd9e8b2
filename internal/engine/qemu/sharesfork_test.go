package qemu

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestSharesForkMemory: only a "shared" checkpoint, or a running VM whose
// RAM is its own share=on file (booted, not restored), gives fork children
// memory they share; a checkpoint of a restored VM is a "stream" whose
// children each load all of its RAM into a file of their own.
func TestSharesForkMemory(t *testing.T) {
	root := t.TempDir()
	e := &Engine{sbRoot: filepath.Join(root, "sandboxes"), live: map[string]*sandbox{}}
	write := func(dir string, v any) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(v)
		if err := os.WriteFile(filepath.Join(dir, "vm.json"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	shared, stream := filepath.Join(root, "snap-shared"), filepath.Join(root, "snap-stream")
	write(shared, snapMeta{vmMeta: vmMeta{SharedRAM: true}, Format: "shared"})
	write(stream, snapMeta{Format: "stream"})
	write(e.dir("booted"), vmMeta{SharedRAM: true})
	write(e.dir("restored"), vmMeta{SharedRAM: false})
	e.live["live-restored"] = &sandbox{meta: vmMeta{SharedRAM: false}}
	e.live["live-booted"] = &sandbox{meta: vmMeta{SharedRAM: true}}
	for _, c := range []struct {
		id, dir string
		want    bool
	}{
		{"", shared, true}, {"", stream, false}, {"", filepath.Join(root, "none"), false},
		{"booted", "", true}, {"restored", "", false}, {"missing", "", false},
		{"live-booted", "", true}, {"live-restored", "", false},
	} {
		if got := e.SharesForkMemory(t.Context(), c.id, c.dir); got != c.want {
			t.Errorf("SharesForkMemory(%q, %q) = %v, want %v", c.id, c.dir, got, c.want)
		}
	}
}
