package service_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// Method budgets: the lifecycle service is composed of parts that own
// their state (admission, lifetimes, traffic, pools, images, builds,
// reconcile, events, hooks), and no type may grow back into one that
// does everything.
const (
	maxMethods        = 60 // any type in the module, interfaces included
	maxManagerMethods = 49 // internal/sandbox.Manager: under 50
)

// TestMethodBudgets counts, with go/ast, the methods declared on every
// type of the module's non-test code (on T and *T; an interface's own
// methods) and fails when one passes maxMethods or the sandbox Manager
// passes maxManagerMethods: split the type into parts instead.
func TestMethodBudgets(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{} // "internal/sandbox.Manager" -> methods
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case "testdata", "node_modules", "vendor", "bin":
				return filepath.SkipDir
			}
			if strings.HasPrefix(d.Name(), ".") && path != root {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		pkg := filepath.ToSlash(rel) + "." // one package per directory
		for _, decl := range f.Decls {
			switch decl := decl.(type) {
			case *ast.FuncDecl:
				if decl.Recv != nil && len(decl.Recv.List) == 1 {
					if name := recvName(decl.Recv.List[0].Type); name != "" {
						counts[pkg+name]++
					}
				}
			case *ast.GenDecl:
				for _, spec := range decl.Specs {
					ts, ok := spec.(*ast.TypeSpec)
					if !ok {
						continue
					}
					if it, ok := ts.Type.(*ast.InterfaceType); ok {
						for _, m := range it.Methods.List {
							if _, ok := m.Type.(*ast.FuncType); ok {
								counts[pkg+ts.Name.Name] += len(m.Names)
							}
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The walk must have seen the types it guards: a count of zero would
	// pass any budget.
	for _, known := range []string{"internal/sandbox.Manager", "internal/store.Store", "sdk.Client"} {
		if counts[known] == 0 {
			t.Fatalf("no methods found on %s: the walk of %s missed it", known, root)
		}
	}
	if n := counts["internal/sandbox.Manager"]; n > maxManagerMethods {
		t.Errorf("internal/sandbox.Manager has %d methods, at most %d: move the new ones to the part that owns their state (see docs/architecture.md)", n, maxManagerMethods)
	}
	type tc struct {
		name string
		n    int
	}
	var all []tc
	for name, n := range counts {
		all = append(all, tc{name, n})
		if n > maxMethods {
			t.Errorf("%s has %d methods, at most %d: split it into parts that own their state", name, n, maxMethods)
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].n > all[j].n || all[i].n == all[j].n && all[i].name < all[j].name })
	for _, c := range all[:min(8, len(all))] {
		t.Logf("%3d %s", c.n, c.name)
	}
}

// recvName is the type name of a method's receiver: T, *T, T[P], *T[P].
func recvName(e ast.Expr) string {
	if s, ok := e.(*ast.StarExpr); ok {
		e = s.X
	}
	switch x := e.(type) {
	case *ast.IndexExpr:
		e = x.X
	case *ast.IndexListExpr:
		e = x.X
	}
	if id, ok := e.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}
