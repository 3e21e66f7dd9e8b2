package e2b

import (
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/front/e2b/envdpb/process"
)

// A command's E2B description round-trips through the agent's tag; envs
// too large for the tag are left out rather than the command not kept,
// and a tag that is not the front's (another client's, or bytes from the
// sandbox) is not taken for one.
func TestKeptTag(t *testing.T) {
	tag, cwd := "web", "/srv"
	cfg := &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "echo hi"}, Envs: map[string]string{"A": "1"}, Cwd: &cwd}
	enc := keptTag(&tag, cfg, "user")
	m, ok := parseKeptTag(enc)
	if !ok || *m.Tag != "web" || m.User != "user" {
		t.Fatalf("%q -> %+v, %v", enc, m, ok)
	}
	got := m.config()
	if got.GetCmd() != "/bin/bash" || strings.Join(got.GetArgs(), " ") != "-l -c echo hi" || got.GetEnvs()["A"] != "1" || got.GetCwd() != "/srv" {
		t.Fatalf("config %+v", got)
	}

	cfg.Envs = map[string]string{"BIG": strings.Repeat("x", maxKeptMeta)}
	enc = keptTag(nil, cfg, "")
	if len(enc) > maxKeptMeta {
		t.Fatalf("tag of %d bytes, over %d", len(enc), maxKeptMeta)
	}
	if m, ok := parseKeptTag(enc); !ok || m.Envs != nil || m.Cmd != "/bin/bash" {
		t.Fatalf("with envs too big: %+v, %v; want kept without its envs", m, ok)
	}
	cfg.Args = []string{strings.Repeat("y", maxKeptMeta)}
	if enc := keptTag(nil, cfg, ""); enc != "" {
		t.Fatalf("a command too big to describe: tag of %d bytes, want none", len(enc))
	}

	for _, bad := range []string{"", "counter", `{"e2b":2,"cmd":"x"}`, `{"e2b":1}`, `{"e2b":1,"cmd":`, `[1,2]`} {
		if m, ok := parseKeptTag(bad); ok {
			t.Errorf("%q taken for a front tag: %+v", bad, m)
		}
	}
}
