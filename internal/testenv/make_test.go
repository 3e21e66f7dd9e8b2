package testenv

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
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

// TestSlowTestsListed: every test that calls Slow is in the Makefile's
// SLOW_TESTS, its package in SLOW_PKGS, and nothing else is listed: a
// slow test left out of the list would run nowhere, CI included.
func TestSlowTestsListed(t *testing.T) {
	root := ModuleRoot()
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	variable := func(name string) []string {
		m := regexp.MustCompile(`(?m)^` + name + ` := (.*)$`).FindSubmatch(mk)
		if m == nil {
			t.Fatalf("the Makefile sets no %s", name)
		}
		return strings.FieldsFunc(string(m[1]), func(r rune) bool { return r == '|' || r == ' ' })
	}
	listed, pkgs := variable("SLOW_TESTS"), variable("SLOW_PKGS")
	funcRE := regexp.MustCompile(`(?m)^func (Test\w+)\(`)
	var found []string
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || d.Name() == "tools" || strings.HasPrefix(d.Name(), ".")) && p != root {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(p, "_test.go") || filepath.Base(p) == "make_test.go" {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		funcs := funcRE.FindAllSubmatchIndex(b, -1)
		for _, call := range regexp.MustCompile(`\b(testenv\.)?Slow\(t\)`).FindAllIndex(b, -1) {
			name := ""
			for _, f := range funcs {
				if f[0] < call[0] {
					name = string(b[f[2]:f[3]])
				}
			}
			if name == "" {
				continue
			}
			found = append(found, name)
			pkg := "./" + filepath.ToSlash(mustRel(t, root, filepath.Dir(p))) + "/"
			if !slices.Contains(listed, name) {
				t.Errorf("%s (%s) calls Slow but the Makefile's SLOW_TESTS does not name it: it would run nowhere", name, pkg)
			}
			if !slices.Contains(pkgs, pkg) {
				t.Errorf("%s calls Slow but the Makefile's SLOW_PKGS does not list %s", name, pkg)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range listed {
		if !slices.Contains(found, name) {
			t.Errorf("SLOW_TESTS names %s, which calls no Slow: `make test` runs it already", name)
		}
	}
}

func mustRel(t *testing.T, base, p string) string {
	r, err := filepath.Rel(base, p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
