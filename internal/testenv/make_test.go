package testenv

import (
	"os/exec"
	"strings"
	"testing"
)

// TestMakeTestInstallsTestDeps: the README's `make test` installs every
// test dependency itself (the E2B JS clients were installed only by
// .ci/run, so a newcomer's `make deps && make test` failed TestRealSDK).
func TestMakeTestInstallsTestDeps(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		missing(t, "make not installed")
	}
	// -B: as on a fresh clone, where nothing is installed yet.
	cmd := exec.Command("make", "-n", "-B", "test")
	cmd.Dir = ModuleRoot()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n test: %v\n%s", err, out)
	}
	for _, want := range []string{"npm ci --prefix internal/front/e2b/testdata/js", "go test"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("make test does not run %q:\n%s", want, out)
		}
	}
}
