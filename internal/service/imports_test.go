package service_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestFrontsImportTheServiceOnly checks each front's direct imports: the
// fronts drive a node through the service interface (and api, errdefs),
// never the Manager, a guest connection or an engine, so that the same
// front can serve a sandbox of another node.
func TestFrontsImportTheServiceOnly(t *testing.T) {
	fronts := []string{"internal/front/httpapi", "internal/ingress", "internal/front/mcp", "internal/front/e2b"}
	// A front not yet converted would be listed here until it is.
	pending := map[string]bool{}
	forbidden := []string{"internal/sandbox", "internal/guest", "internal/engine"}
	const mod = "github.com/clade-sandbox/clade/"
	args := []string{"list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}"}
	for _, f := range fronts {
		args = append(args, mod+f)
	}
	for f := range pending {
		args = append(args, mod+f)
	}
	out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), args...).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, " ")
		front := strings.TrimPrefix(pkg, mod)
		seen++
		var bad []string
		for _, imp := range strings.Fields(imports) {
			for _, f := range forbidden {
				if imp == mod+f || strings.HasPrefix(imp, mod+f+"/") {
					bad = append(bad, strings.TrimPrefix(imp, mod))
				}
			}
		}
		switch {
		case pending[front] && len(bad) == 0:
			t.Errorf("%s no longer imports the Manager, guest or engines: move it from pending to fronts", front)
		case pending[front]:
			t.Logf("%s still imports %v (pending)", front, bad)
		case len(bad) > 0:
			t.Errorf("%s imports %v: a front drives the node through internal/service only", front, bad)
		}
	}
	if seen != len(fronts)+len(pending) {
		t.Fatalf("go list named %d packages, want %d:\n%s", seen, len(fronts)+len(pending), out)
	}
}
