package mcp_test

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/clade-sandbox/clade/internal/codeint"
	cmcp "github.com/clade-sandbox/clade/internal/front/mcp"
	"github.com/clade-sandbox/clade/internal/testenv"
)

// TestRunCodeTool drives run_code through the real `clade mcp` against a
// sandbox of the code-interpreter image: state kept between calls, a
// matplotlib figure as MCP image content (a PNG an agent can look at), an
// exception's traceback without colour codes, and a sandbox without an
// interpreter refused with a tool error that says which image to use.
func TestRunCodeTool(t *testing.T) {
	testenv.BuiltinImage(t, codeint.Image)
	d := testenv.StartDaemon(t)
	cmd := exec.Command(d.Bin, "--host", d.Socket, "mcp")
	cmd.Stderr = testWriter{t}
	cs, err := mcpsdk.NewClient(&mcpsdk.Implementation{Name: "test", Version: "1"}, nil).
		Connect(t.Context(), &mcpsdk.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	ctx := t.Context()
	call := func(name string, args map[string]any, out any) *mcpsdk.CallToolResult {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcpsdk.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if res.IsError {
			t.Fatalf("%s failed: %s", name, text(res))
		}
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: structured content %s: %v", name, b, err)
		}
		return res
	}

	var sb cmcp.Sandbox
	call("create_sandbox", map[string]any{"image": codeint.Image, "memory_mib": 1024}, &sb)
	var out cmcp.RunCodeOutput
	call("run_code", map[string]any{"sandbox": sb.ID, "code": "x = 20\nprint('set')"}, &out)
	if out.Stdout != "set\n" {
		t.Fatalf("first run: %+v", out)
	}
	res := call("run_code", map[string]any{"sandbox": sb.ID, "code": "x * 2 + 2"}, &out)
	if out.Result != "42" || !strings.Contains(text(res), "42") {
		t.Fatalf("state kept: %+v, text %q", out, text(res))
	}
	res = call("run_code", map[string]any{"sandbox": sb.ID, "code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"}, &out)
	var png []byte
	for _, c := range res.Content {
		if img, ok := c.(*mcpsdk.ImageContent); ok && img.MIMEType == "image/png" {
			png = img.Data
		}
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG\r\n")) {
		t.Fatalf("a figure came back without a PNG image content (%d bytes): %+v", len(png), res.Content)
	}
	call("run_code", map[string]any{"sandbox": sb.ID, "code": "def f():\n    return 1/0\nf()"}, &out)
	if !strings.HasPrefix(out.Error, "ZeroDivisionError") || !strings.Contains(out.Error, "f()") || strings.Contains(out.Error, "\x1b[") {
		t.Fatalf("exception: %q", out.Error)
	}

	call("create_sandbox", map[string]any{"name": "plain", "memory_mib": 256}, &sb)
	res, err = cs.CallTool(ctx, &mcpsdk.CallToolParams{Name: "run_code", Arguments: map[string]any{"sandbox": "plain", "code": "1"}})
	if err != nil || !res.IsError || !strings.Contains(text(res), codeint.Image) {
		t.Fatalf("run_code in a sandbox without an interpreter: %v %+v", err, res)
	}
}
