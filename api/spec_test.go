package api_test

import (
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/front/httpapi"
)

// spec is the part of an OpenAPI document the tests compare with the code.
type spec struct {
	OpenAPI    string                              `yaml:"openapi"`
	Paths      map[string]map[string]yaml.Node     `yaml:"paths"`
	Components struct{ Schemas map[string]schema } `yaml:"components"`
}

type schema struct {
	Properties map[string]yaml.Node `yaml:"properties"`
	Required   []string             `yaml:"required"`
}

const fix = "update api/openapi.yaml"

func loadSpec(t *testing.T) (spec, *yaml.Node) {
	t.Helper()
	b, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var s spec
	if err := yaml.Unmarshal(b, &s); err != nil {
		t.Fatalf("openapi.yaml does not parse: %v", err)
	}
	var root yaml.Node
	if err := yaml.Unmarshal(b, &root); err != nil {
		t.Fatal(err)
	}
	if s.OpenAPI != "3.0.3" {
		t.Errorf("openapi.yaml declares openapi %q, want 3.0.3", s.OpenAPI)
	}
	return s, &root
}

var httpMethods = map[string]bool{"get": true, "put": true, "post": true, "delete": true,
	"options": true, "head": true, "patch": true, "trace": true}

// TestSpecRoutes checks that the spec documents exactly the daemon's routes.
func TestSpecRoutes(t *testing.T) {
	s, _ := loadSpec(t)
	// New must not touch the manager or the image store, so nil is fine.
	srv := httpapi.New(httpapi.Config{}, nil, prometheus.NewRegistry())
	if len(srv.Routes) == 0 {
		t.Fatal("httpapi.New registered no routes in Server.Routes")
	}

	inSpec := map[string]bool{}
	for p, item := range s.Paths {
		if p == "/metrics" {
			continue // served by promhttp, not an API route
		}
		for m := range item {
			if httpMethods[m] {
				inSpec[strings.ToUpper(m)+" "+p] = true
			}
		}
	}
	inCode := map[string]bool{}
	for _, r := range srv.Routes {
		inCode[r] = true
	}
	for _, r := range sortedKeys(inCode) {
		if !inSpec[r] {
			t.Errorf("route %q is served by the daemon but missing from the spec: %s", r, fix)
		}
	}
	for _, r := range sortedKeys(inSpec) {
		if !inCode[r] {
			t.Errorf("route %q is in the spec but the daemon does not serve it: %s", r, fix)
		}
	}
	if _, ok := s.Paths["/metrics"]["get"]; !ok {
		t.Errorf("GET /metrics is served but missing from the spec: %s", fix)
	}
}

// TestSpecSchemas checks that every API type has a schema of the same name
// with its JSON fields, requiring exactly those without omitempty.
func TestSpecSchemas(t *testing.T) {
	s, _ := loadSpec(t)
	for _, v := range []any{api.Sandbox{}, api.CreateSandboxRequest{}, api.ExecRequest{}, api.ExitStatus{},
		api.Image{}, api.Health{}, api.Error{},
		api.Snapshot{}, api.SnapshotRequest{}, api.ForkRequest{}, api.ForkChild{}, api.ForkResult{},
		api.RunCodeRequest{}, api.CodeEvent{}, api.CodeContext{}, api.CreateCodeContextRequest{},
		api.Network{}, api.NetworkChange{}, api.ImageConfig{}, api.PullImageRequest{}, api.ImageProgress{}, api.ImageEvent{}, api.CommitRequest{},
		api.BuildSandboxRequest{}, api.BuildEvent{}, api.Ingress{}, api.TimeoutRequest{}, api.Event{}, api.EventExec{}, api.SandboxStats{},
		api.Volume{}, api.CreateVolumeRequest{}, api.VolumeKey{}, api.VolumeMount{}, api.Secret{}, api.SetSecretRequest{}, api.SecretRef{}, api.Node{}, api.NodeCapacity{}} {
		typ := reflect.TypeOf(v)
		t.Run(typ.Name(), func(t *testing.T) {
			sc, ok := s.Components.Schemas[typ.Name()]
			if !ok {
				t.Fatalf("no schema %s in components/schemas for api.%s: %s", typ.Name(), typ.Name(), fix)
			}
			props, required := jsonFields(typ)
			specProps := sortedKeys(sc.Properties)
			for _, p := range props {
				if _, ok := sc.Properties[p]; !ok {
					t.Errorf("schema %s lacks property %q of api.%s: %s", typ.Name(), p, typ.Name(), fix)
				}
			}
			for _, p := range specProps {
				if !slices.Contains(props, p) {
					t.Errorf("schema %s has property %q that api.%s has no JSON field for: %s", typ.Name(), p, typ.Name(), fix)
				}
			}
			for _, p := range required {
				if !slices.Contains(sc.Required, p) {
					t.Errorf("schema %s does not require %q, but api.%s has it without omitempty: %s", typ.Name(), p, typ.Name(), fix)
				}
			}
			for _, p := range sc.Required {
				if !slices.Contains(required, p) {
					t.Errorf("schema %s requires %q, but api.%s has it with omitempty or not at all: %s", typ.Name(), p, typ.Name(), fix)
				}
			}
		})
	}
}

// TestSpecRefs checks that every $ref points at a defined component.
func TestSpecRefs(t *testing.T) {
	_, root := loadSpec(t)
	doc := root.Content[0]
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		if n.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == "$ref" && !resolves(doc, n.Content[i+1].Value) {
					t.Errorf("line %d: $ref %q points at nothing: %s", n.Content[i+1].Line, n.Content[i+1].Value, fix)
				}
			}
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(doc)
}

// resolves reports whether ref, a local JSON pointer like
// "#/components/schemas/Error", names a node of doc.
func resolves(doc *yaml.Node, ref string) bool {
	rest, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return false
	}
	n := doc
	for _, key := range strings.Split(rest, "/") {
		key = strings.NewReplacer("~1", "/", "~0", "~").Replace(key)
		if n.Kind != yaml.MappingNode {
			return false
		}
		var next *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == key {
				next = n.Content[i+1]
			}
		}
		if next == nil {
			return false
		}
		n = next
	}
	return true
}

// jsonFields returns the sorted JSON names of t's fields as encoding/json
// marshals them, and the sorted subset without omitempty.
func jsonFields(t reflect.Type) (names, required []string) {
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" {
			name = f.Name
		}
		names = append(names, name)
		if !slices.Contains(strings.Split(opts, ","), "omitempty") {
			required = append(required, name)
		}
	}
	slices.Sort(names)
	slices.Sort(required)
	return names, required
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
