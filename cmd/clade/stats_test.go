package main_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

func TestStatsVerb(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	out, errs, code := cli(t, d, "", "create", "--name", "stats-box", "--memory", "256")
	if code != 0 {
		t.Fatalf("create: %q %q %d", out, errs, code)
	}
	id := strings.TrimSpace(out)

	out, errs, code = cli(t, d, "", "stats", "--no-stream", "--interval", "100ms")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 2 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[0], "MEM USAGE / LIMIT") {
		t.Fatalf("stats --no-stream: %q %q %d", out, errs, code)
	}
	if f := strings.Fields(lines[1]); len(f) < 9 || f[0] != id || f[1] != "stats-box" || f[2] != "running" ||
		!strings.HasSuffix(f[3], "%") || f[6] != "256.0MiB" || f[8] == "--" {
		t.Fatalf("stats row %q", lines[1])
	}

	out, errs, code = cli(t, d, "", "stats", "--json", "stats-box")
	var sts []sdk.SandboxStats
	if code != 0 || json.Unmarshal([]byte(out), &sts) != nil || len(sts) != 1 || sts[0].ID != id || sts[0].MemoryBytes == 0 || sts[0].Pids < 1 {
		t.Fatalf("stats --json: %q %q %d", out, errs, code)
	}

	for _, tc := range []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"stats", "--no-stream", "nope"}, 1, "no such sandbox"},
		{[]string{"stats", "--interval", "1ns"}, 1, "too short"},
		{[]string{"mcp", "--http", "0.0.0.0:0"}, 1, "set a token"},
		{[]string{"mcp", "--token-file", "/dev/null"}, 2, "for --http"}, // a usage error
		{[]string{"mcp", "extra"}, 2, "unexpected argument"},
	} {
		if _, errs, code := cli(t, d, "", tc.args...); code != tc.code || !strings.Contains(errs, tc.stderr) {
			t.Errorf("clade %v: code %d stderr %q; want %d and %q", tc.args, code, errs, tc.code, tc.stderr)
		}
	}
}
