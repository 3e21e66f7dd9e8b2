package mcp_test

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	cmcp "github.com/clade-sandbox/clade/internal/front/mcp"
	"github.com/clade-sandbox/clade/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Cleanup()
	os.Exit(code)
}

var allTools = []string{"create_sandbox", "fork", "list_files", "list_sandboxes", "read_file", "remove_sandbox",
	"run_code", "run_command", "sandbox_stats", "sleep_sandbox", "snapshot_sandbox", "wake_sandbox", "write_file"}

// TestStdio runs the real `clade mcp` as a subprocess, as a desktop agent
// does, and drives it with the MCP SDK's own client.
func TestStdio(t *testing.T) {
	d := testenv.StartDaemon(t)
	cmd := exec.Command(d.Bin, "--host", d.Socket, "mcp", "--max-output", "4096")
	cmd.Stderr = testWriter{t}
	cs, err := mcpsdk.NewClient(&mcpsdk.Implementation{Name: "test", Version: "1"}, nil).
		Connect(t.Context(), &mcpsdk.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	exercise(t, cs, 4096)
}

// TestHTTP serves `clade mcp --http` with a token and drives it over
// streamable HTTP; a request without the token is refused.
func TestHTTP(t *testing.T) {
	d := testenv.StartDaemon(t)
	cmd := exec.Command(d.Bin, "--host", d.Socket, "mcp", "--http", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "CLADE_TOKEN=s3cret")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(stderr)
	var url string
	for sc.Scan() {
		if _, u, ok := strings.Cut(sc.Text(), "serving MCP on "); ok {
			url = u
			break
		}
		t.Log(sc.Text())
	}
	if url == "" {
		t.Fatalf("clade mcp --http did not say where it serves: %v", sc.Err())
	}
	go func() { _, _ = io.Copy(io.Discard, stderr) }()

	resp, err := http.Post(url, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("request without the token: %s, want 401", resp.Status)
	}

	hc := &http.Client{Transport: bearer{"s3cret"}}
	cs, err := mcpsdk.NewClient(&mcpsdk.Implementation{Name: "test", Version: "1"}, nil).
		Connect(t.Context(), &mcpsdk.StreamableClientTransport{Endpoint: url, HTTPClient: hc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	exercise(t, cs, 32<<10)
}

type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Logf("clade mcp: %s", p); return len(p), nil }

// exercise initializes, lists the tools and calls every one of them
// against the real daemon, then makes bad calls that must come back as
// tool errors from a server that keeps serving.
func exercise(t *testing.T, cs *mcpsdk.ClientSession, maxOutput int) {
	ctx := t.Context()
	if ir := cs.InitializeResult(); ir == nil || ir.ServerInfo.Name != "clade" || ir.Instructions == "" {
		t.Fatalf("initialize result: %+v", ir)
	}
	lt, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range lt.Tools {
		names = append(names, tool.Name)
		schema, _ := json.Marshal(tool.InputSchema)
		if len(tool.Description) < 60 || !strings.Contains(string(schema), `"description"`) {
			t.Errorf("tool %s: description %q and input schema %s are not enough for a model", tool.Name, tool.Description, schema)
		}
	}
	slices.Sort(names)
	if !slices.Equal(names, allTools) {
		t.Fatalf("tools %v, want %v", names, allTools)
	}

	// call calls a tool that must succeed and decodes its structured result.
	call := func(name string, args map[string]any, out any) *mcpsdk.CallToolResult {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcpsdk.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s(%v): %v", name, args, err)
		}
		if res.IsError {
			t.Fatalf("%s(%v) failed: %s", name, args, text(res))
		}
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: structured content %s: %v", name, b, err)
		}
		return res
	}
	// fail calls a tool that must fail with a tool error saying want.
	fail := func(name string, args map[string]any, want string) {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcpsdk.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s(%v): a protocol error (%v), want a tool error", name, args, err)
		}
		if !res.IsError || !strings.Contains(text(res), want) {
			t.Fatalf("%s(%v) = error %v %q, want a tool error containing %q", name, args, res.IsError, text(res), want)
		}
	}

	var sb cmcp.Sandbox
	call("create_sandbox", map[string]any{"name": "mcp-box", "memory_mib": 256, "labels": map[string]string{"by": "mcp"}}, &sb)
	if sb.ID == "" || sb.State != "running" || sb.Name != "mcp-box" || sb.MemoryMiB != 256 {
		t.Fatalf("created %+v", sb)
	}

	var run cmcp.RunOutput
	res := call("run_command", map[string]any{"sandbox": "mcp-box", "command": "echo hi; echo oops >&2; exit 3"}, &run)
	if run.ExitCode != 3 || run.Stdout != "hi\n" || run.Stderr != "oops\n" || run.Truncated != "" {
		t.Fatalf("run_command: %+v", run)
	}
	if txt := text(res); !strings.Contains(txt, "exit code: 3") || !strings.Contains(txt, "hi") {
		t.Fatalf("run_command text: %q", txt)
	}
	call("run_command", map[string]any{"sandbox": sb.ID, "args": []string{"cat"}, "stdin": "fed\n"}, &run)
	if run.ExitCode != 0 || run.Stdout != "fed\n" {
		t.Fatalf("run_command with args and stdin: %+v", run)
	}
	call("run_command", map[string]any{"sandbox": sb.ID, "command": "seq 1 100000"}, &run)
	if run.ExitCode != 0 || !strings.Contains(run.Truncated, "bytes cut from the middle of stdout") ||
		len(run.Stdout) > maxOutput+100 || !strings.HasPrefix(run.Stdout, "1\n2\n3\n") || !strings.HasSuffix(run.Stdout, "99999\n100000\n") ||
		!strings.Contains(run.Stdout, "bytes cut ...]") {
		t.Fatalf("run_command with long output: truncated %q, %d bytes of stdout: %.200q...", run.Truncated, len(run.Stdout), run.Stdout)
	}
	call("run_command", map[string]any{"sandbox": sb.ID, "command": "sleep 30", "timeout_seconds": 1}, &run)
	if !run.TimedOut || run.ExitCode != 124 {
		t.Fatalf("run_command past its timeout: %+v, want timed_out and exit code 124", run)
	}

	var wrote cmcp.WriteFileOutput
	call("write_file", map[string]any{"sandbox": sb.ID, "path": "/work/new/dir/hello.py", "content": "print('hello')\n", "mode": "755"}, &wrote)
	if wrote.Size != 15 {
		t.Fatalf("write_file: %+v", wrote)
	}
	call("run_command", map[string]any{"sandbox": sb.ID, "command": "python3 /work/new/dir/hello.py && stat -c %a /work/new/dir/hello.py"}, &run)
	if run.Stdout != "hello\n755\n" {
		t.Fatalf("the written file runs as %+v", run)
	}
	bin := []byte{0, 1, 2, 0xff, 0xfe}
	call("write_file", map[string]any{"sandbox": sb.ID, "path": "/work/new/blob", "content": base64.StdEncoding.EncodeToString(bin), "encoding": "base64"}, &wrote)

	var read cmcp.ReadFileOutput
	call("read_file", map[string]any{"sandbox": sb.ID, "path": "/work/new/dir/hello.py"}, &read)
	if read.Encoding != "text" || read.Content != "print('hello')\n" || read.Size != 15 {
		t.Fatalf("read_file: %+v", read)
	}
	call("read_file", map[string]any{"sandbox": sb.ID, "path": "/work/new/blob"}, &read)
	if read.Encoding != "base64" || read.Content != base64.StdEncoding.EncodeToString(bin) {
		t.Fatalf("read_file of a binary file: %+v", read)
	}

	var ls cmcp.ListFilesOutput
	call("list_files", map[string]any{"sandbox": sb.ID, "path": "/work/new"}, &ls)
	want := []cmcp.FileEntry{{Name: "blob", Type: "file", Size: 5, Mode: "644"}, {Name: "dir", Type: "dir"}}
	if got := sortEntries(ls.Entries); len(got) != 2 || got[0].Name != want[0].Name || got[0].Type != want[0].Type || got[0].Size != want[0].Size ||
		got[0].Mode != want[0].Mode || got[1].Name != "dir" || got[1].Type != "dir" || got[0].Modified == "" {
		t.Fatalf("list_files: %+v", ls)
	}
	call("list_files", map[string]any{"sandbox": sb.ID, "path": "/work/new", "depth": 3}, &ls)
	if !slices.ContainsFunc(ls.Entries, func(e cmcp.FileEntry) bool { return e.Name == "dir/hello.py" && e.Type == "file" }) {
		t.Fatalf("list_files depth 3: %+v", ls)
	}

	// find cannot read some of /proc/self (its own fds vanish as it lists
	// them): the rest is listed, with a note.
	call("list_files", map[string]any{"sandbox": sb.ID, "path": "/proc/self", "depth": 2}, &ls)
	if !slices.ContainsFunc(ls.Entries, func(e cmcp.FileEntry) bool { return e.Name == "status" }) || ls.Unreadable == "" {
		t.Fatalf("list_files of /proc/self: %d entries, unreadable %q", len(ls.Entries), ls.Unreadable)
	}

	// The file as a resource.
	tmpls, err := cs.ListResourceTemplates(ctx, nil)
	if err != nil || len(tmpls.ResourceTemplates) != 1 {
		t.Fatalf("resource templates: %+v, %v", tmpls, err)
	}
	rr, err := cs.ReadResource(ctx, &mcpsdk.ReadResourceParams{URI: "clade://sandboxes/" + sb.ID + "/files/work/new/dir/hello.py"})
	if err != nil || len(rr.Contents) != 1 || rr.Contents[0].Text != "print('hello')\n" {
		t.Fatalf("read resource: %+v, %v", rr, err)
	}
	rr, err = cs.ReadResource(ctx, &mcpsdk.ReadResourceParams{URI: "clade://sandboxes/mcp-box/files/work/new"})
	if err != nil || len(rr.Contents) != 1 || !strings.Contains(rr.Contents[0].Text, "dir/\tdir") {
		t.Fatalf("read directory resource: %+v, %v", rr, err)
	}
	if _, err := cs.ReadResource(ctx, &mcpsdk.ReadResourceParams{URI: "clade://sandboxes/" + sb.ID + "/files/no/such/file"}); err == nil {
		t.Fatal("reading a missing file's resource succeeded")
	}

	var stats cmcp.StatsOutput
	call("sandbox_stats", map[string]any{"sandbox": sb.ID}, &stats)
	if stats.State != "running" || stats.MemoryBytes == 0 || stats.Processes < 1 || stats.MemoryLimitBytes != 256<<20 {
		t.Fatalf("sandbox_stats: %+v", stats)
	}

	var snap cmcp.SnapshotOutput
	call("snapshot_sandbox", map[string]any{"sandbox": sb.ID, "name": "mcp-snap"}, &snap)
	if snap.ID == "" || snap.Sandbox != sb.ID || snap.Name != "mcp-snap" {
		t.Fatalf("snapshot_sandbox: %+v", snap)
	}
	var forked cmcp.ForkOutput
	call("fork", map[string]any{"source": "mcp-snap", "n": 2}, &forked)
	if forked.Snapshot != snap.ID || len(forked.Children) != 2 || forked.Children[0].ID == "" || forked.Children[1].ID == "" {
		t.Fatalf("fork: %+v", forked)
	}
	child := forked.Children[1].ID
	call("run_command", map[string]any{"sandbox": child, "command": "cat /work/new/dir/hello.py"}, &run)
	if run.Stdout != "print('hello')\n" {
		t.Fatalf("a fork child does not have the source's file: %+v", run)
	}

	var slept, woken cmcp.Sandbox
	call("sleep_sandbox", map[string]any{"sandbox": child}, &slept)
	if slept.State != "sleeping" {
		t.Fatalf("sleep_sandbox: %+v", slept)
	}
	call("wake_sandbox", map[string]any{"sandbox": child}, &woken)
	if woken.State != "running" || woken.ID != child {
		t.Fatalf("wake_sandbox: %+v", woken)
	}

	var list cmcp.ListOutput
	call("list_sandboxes", nil, &list)
	if len(list.Sandboxes) != 3 {
		t.Fatalf("list_sandboxes: %+v", list)
	}
	call("list_sandboxes", map[string]any{"labels": map[string]string{"by": "mcp"}}, &list)
	if len(list.Sandboxes) != 3 { // fork children keep their source's labels
		t.Fatalf("list_sandboxes by label: %+v", list)
	}
	var removed cmcp.RemoveOutput
	for _, c := range forked.Children {
		call("remove_sandbox", map[string]any{"sandbox": c.ID}, &removed)
		if removed.Removed != c.ID {
			t.Fatalf("remove_sandbox: %+v", removed)
		}
	}
	call("list_sandboxes", nil, &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != sb.ID {
		t.Fatalf("list_sandboxes after removing the children: %+v", list)
	}

	// Bad calls: tool errors with the daemon's message, and the server goes on.
	fail("run_command", map[string]any{"sandbox": "no-such-sandbox", "command": "true"}, "no such sandbox")
	fail("remove_sandbox", map[string]any{"sandbox": "no-such-sandbox"}, "no such sandbox")
	fail("run_command", map[string]any{"sandbox": sb.ID}, "nothing to run")
	fail("run_command", map[string]any{"command": "true"}, "sandbox")
	fail("read_file", map[string]any{"sandbox": sb.ID, "path": "/work/new"}, "is a directory")
	fail("read_file", map[string]any{"sandbox": sb.ID, "path": "relative.txt"}, "not absolute")
	fail("read_file", map[string]any{"sandbox": sb.ID, "path": "/no/such/file"}, "no such")
	fail("list_files", map[string]any{"sandbox": sb.ID, "path": "/no/such/dir"}, "No such file")
	fail("write_file", map[string]any{"sandbox": sb.ID, "path": "/work/new", "content": "x"}, "is a directory")
	fail("fork", map[string]any{"source": sb.ID, "n": 1000}, "give 1 to")
	fail("wake_sandbox", map[string]any{"sandbox": "no-such-sandbox"}, "no such sandbox")
	call("run_command", map[string]any{"sandbox": sb.ID, "command": "echo still here"}, &run)
	if run.Stdout != "still here\n" {
		t.Fatalf("after bad calls: %+v", run)
	}

	call("remove_sandbox", map[string]any{"sandbox": "mcp-box"}, &removed)
	call("list_sandboxes", nil, &list)
	if len(list.Sandboxes) != 0 {
		t.Fatalf("list_sandboxes after removing all: %+v", list)
	}
}

func sortEntries(es []cmcp.FileEntry) []cmcp.FileEntry {
	es = slices.Clone(es)
	slices.SortFunc(es, func(a, b cmcp.FileEntry) int { return strings.Compare(a.Name, b.Name) })
	return es
}

func text(res *mcpsdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcpsdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}
