package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/sdk"
)

// TestStatsNodeColumn: clade stats shows a NODE column when the readings
// name nodes other than "local" (a cluster's), none otherwise, and says
// why a reading is missing (a node that did not answer) once.
func TestStatsNodeColumn(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name string
		cur  []sdk.SandboxStats
		node bool
	}{
		{"cluster", []sdk.SandboxStats{
			{ID: "aaaa", State: "running", Node: "n1", ReadAt: now, MemoryBytes: 1 << 20, MemoryLimitBytes: 1 << 29, Pids: 2},
			{ID: "bbbb", State: "running", Node: "n2", ReadAt: now, Error: "node n2 did not answer within 3s: no reading"},
			{ID: "cccc", State: "running", Node: "n2", ReadAt: now, Error: "node n2 did not answer within 3s: no reading"}}, true},
		{"single", []sdk.SandboxStats{{ID: "aaaa", State: "running", ReadAt: now}}, false},
		{"single-local", []sdk.SandboxStats{{ID: "aaaa", State: "running", Node: "local", ReadAt: now}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			writeStats(&b, nil, tc.cur)
			lines := strings.Split(strings.TrimSpace(b.String()), "\n")
			if strings.Contains(lines[0], "NODE") != tc.node {
				t.Fatalf("NODE column shown=%v, want %v:\n%s", !tc.node, tc.node, b.String())
			}
			for i, s := range tc.cur {
				f := strings.Fields(lines[i+1])
				if f[0] != s.ID || tc.node && f[2] != s.Node {
					t.Fatalf("row %d %q for %+v", i, lines[i+1], s)
				}
			}
			notes := strings.Count(b.String(), "did not answer")
			if want := map[bool]int{true: 1, false: 0}[tc.node]; notes != want {
				t.Fatalf("%d notes of the node that did not answer, want %d:\n%s", notes, want, b.String())
			}
		})
	}
}
