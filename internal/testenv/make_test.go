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
	err = walkTestFiles(root, func(p string, b []byte) error {
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

// walkTestFiles calls f with each _test.go file of the tree at root and its
// bytes (but this one, node_modules, tools and hidden directories).
func walkTestFiles(root string, f func(p string, b []byte) error) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
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
		return f(p, b)
	})
}

func mustRel(t *testing.T, base, p string) string {
	r, err := filepath.Rel(base, p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestClusterTestsListed: every test that starts a cluster of daemons in
// network namespaces is named for the Makefile's CLUSTER_TESTS (which
// `make test` skips and `make test-cluster` runs) and lives in
// internal/cluster (test-cluster's package), so none runs twice or nowhere.
func TestClusterTestsListed(t *testing.T) {
	root := ModuleRoot()
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^CLUSTER_TESTS := (.*)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("the Makefile sets no CLUSTER_TESTS")
	}
	listed, err := regexp.Compile(string(m[1]))
	if err != nil {
		t.Fatalf("CLUSTER_TESTS: %v", err)
	}
	funcRE := regexp.MustCompile(`(?m)^func (\w+)[\[(]`)
	starts := regexp.MustCompile(`\b(testenv\.)?StartNetCluster(With)?\(|\bstoreCluster\(`)
	n := 0
	err = walkTestFiles(root, func(p string, b []byte) error {
		pkg := filepath.ToSlash(mustRel(t, root, filepath.Dir(p)))
		funcs := funcRE.FindAllSubmatchIndex(b, -1)
		for _, f := range funcs {
			if name := string(b[f[2]:f[3]]); strings.HasPrefix(name, "Test") && listed.MatchString(name) && pkg != "internal/cluster" {
				t.Errorf("%s (%s) matches CLUSTER_TESTS but `make test-cluster` runs only ./internal/cluster/: it would run nowhere", name, pkg)
			}
		}
		for _, call := range starts.FindAllIndex(b, -1) {
			name := ""
			for _, f := range funcs {
				if f[0] < call[0] {
					name = string(b[f[2]:f[3]])
				}
			}
			if !strings.HasPrefix(name, "Test") { // a helper, a benchmark
				continue
			}
			n++
			if !listed.MatchString(name) {
				t.Errorf("%s (%s) starts a cluster in network namespaces but does not match the Makefile's CLUSTER_TESTS %q: `make test` would run it (15-30 min of them belong in `make test-cluster`)", name, pkg, m[1])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Error("no test starts a cluster: CLUSTER_TESTS and `make test-cluster` are left over")
	}
}
