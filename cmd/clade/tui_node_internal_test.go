package main

import (
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/sdk"
)

// TestTUINodeColumn: a daemon of a cluster lists every node's sandboxes,
// each with its node; the TUI then shows a NODE column, within 80
// columns, and a daemon of its own shows none.
func TestTUINodeColumn(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name string
		sbs  []sdk.Sandbox
		node bool
	}{
		{"cluster", []sdk.Sandbox{{ID: "aaaaaaaaaaaaaaaa", Name: "web", State: "running", Image: "default", Node: "n1", CreatedAt: now},
			{ID: "bbbbbbbbbbbbbbbb", State: "sleeping", Image: "default", Node: "node-two-long", CreatedAt: now}}, true},
		{"single", []sdk.Sandbox{{ID: "aaaaaaaaaaaaaaaa", State: "running", Image: "default", CreatedAt: now}}, false},
		// A daemon outside a cluster names its node "local".
		{"single-local", []sdk.Sandbox{{ID: "aaaaaaaaaaaaaaaa", State: "running", Image: "default", Node: "local", CreatedAt: now}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &tuiModel{width: 80, height: 24, loaded: true, sandboxes: tc.sbs}
			screen := m.View().Content
			if strings.Contains(screen, "NODE") != tc.node {
				t.Fatalf("NODE column shown=%v, want %v:\n%s", !tc.node, tc.node, screen)
			}
			for _, l := range strings.Split(screen, "\n") {
				if n := len([]rune(l)); n > 80 {
					t.Errorf("a line of %d columns: %q", n, l)
				}
			}
			for _, sb := range tc.sbs {
				var row string
				for _, l := range strings.Split(screen, "\n") {
					if strings.Contains(l, sb.ID) {
						row = l
					}
				}
				if row == "" {
					t.Fatalf("no row for %s:\n%s", sb.ID, screen)
				}
				if tc.node && !strings.Contains(row, clip(sb.Node, 6)) {
					t.Errorf("the row of %s does not show its node %q: %q", sb.ID, sb.Node, row)
				}
			}
		})
	}
}
