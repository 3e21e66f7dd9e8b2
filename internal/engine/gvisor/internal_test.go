package gvisor

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestStateFileID(t *testing.T) {
	for _, tc := range []struct {
		name, id string
		ok       bool
	}{
		{"0123456789abcdef_sandbox:0123456789abcdef.state", "0123456789abcdef", true},
		{"abc_sandbox:def.state", "abc", true},
		{"abc_sandbox:def.lock", "", false},
		{"null-netns", "", false},
		{"_sandbox:def.state", "", false},
		{"abc_sandbox:.state", "", false},
		{"abc.state", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, ok := stateFileID(tc.name)
			if id != tc.id || ok != tc.ok {
				t.Fatalf("stateFileID(%q) = %q, %v; want %q, %v", tc.name, id, ok, tc.id, tc.ok)
			}
		})
	}
}

// TestListFromStateFiles: a sandbox runsc records but whose directory is
// gone is listed by its id.
func TestListFromStateFiles(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "fake-binary")
	if err := os.WriteFile(fake, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{StateDir: filepath.Join(dir, "state"), Runsc: fake, AgentPath: fake})
	if err != nil {
		t.Fatal(err)
	}
	id := "0123456789abcdef"
	if err := os.WriteFile(filepath.Join(e.runRoot, id+"_sandbox:"+id+".state"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	ids, err := e.List(context.Background())
	if err != nil || !slices.Equal(ids, []string{id}) {
		t.Fatalf("List = %v, %v; want [%s]", ids, err, id)
	}
}

// TestDestroyRemovesStaleStateFiles: a restore cut short by a daemon kill
// leaves runsc's record of a dead sandbox; destroying the id must remove
// it, or the next restore of the same id tries to reach the dead process.
func TestDestroyRemovesStaleStateFiles(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "fake-binary")
	if err := os.WriteFile(fake, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{StateDir: filepath.Join(dir, "state"), Runsc: fake, AgentPath: fake})
	if err != nil {
		t.Fatal(err)
	}
	id, other := "0123456789abcdef", "fedcba9876543210"
	for _, name := range []string{id + "_sandbox:" + id + ".state", id + "_sandbox:" + id + ".lock", other + "_sandbox:" + other + ".state"} {
		if err := os.WriteFile(filepath.Join(e.runRoot, name), []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Destroy(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	ids, _ := e.List(context.Background())
	if !slices.Equal(ids, []string{other}) {
		t.Fatalf("after Destroy(%s) the engine still knows %v, want only %s", id, ids, other)
	}
	if _, err := os.Stat(filepath.Join(e.runRoot, id+"_sandbox:"+id+".lock")); !os.IsNotExist(err) {
		t.Fatalf("the lock file is still there: %v", err)
	}
}
