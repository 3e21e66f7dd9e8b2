package cluster_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// frontServer is a small HTTP server run in a sandbox on port 8000: / says
// hello, /stream sends three lines a second apart.
const frontServer = `
import http.server, sys, time
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if self.path == "/stream":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i, line in enumerate(["one\n", "two\n", "three\n"]):
                if i:
                    time.sleep(1)
                b = line.encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(b), b))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            return
        body = ("hello from " + sys.argv[1] + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), H).serve_forever()
`

// TestNetClusterFronts: every front of a node serves a sandbox another
// node holds. Three nodes with a cluster token apart from the API token
// (--cluster-token-file), each with an ingress and an E2B front; a
// sandbox on n1, reached through n3 only: n3's TCP API with the users'
// token (list shows it on n1; exec is proxied to n1 with the cluster
// token), n3's ingress (a Host header PORT-ID.DOMAIN: a plain answer and a
// streamed one that arrives as it is sent), n3's E2B front (REST list and
// get; envd's files upload and download, by Go HTTP calls of the envd
// API), E2B's commands (run through n3; a background command listed,
// connected and killed through n2: netkept_test.go), the kept routes
// peer-only, and MCP (`clade mcp` on n3's socket: list_sandboxes shows the
// node, run_command runs on n1).
func TestNetClusterFronts(t *testing.T) {
	dir := testenv.TempDir(t)
	clusterTok := filepath.Join(dir, "cluster-token")
	if err := os.WriteFile(clusterTok, []byte("nodes-only-"+filepath.Base(dir)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := testenv.StartNetCluster(t, 3, []string{"--cluster-token-file", clusterTok,
		"--ingress", "0.0.0.0:8080", "--ingress-domain", "clade.test", "--e2b", "0.0.0.0:3000"}, nil)
	n1, n3 := c.Nodes[0], c.Nodes[2]
	apiTok := readTok(t, c.Token)
	nodesTok := readTok(t, clusterTok)
	ctx := t.Context()

	sb, err := n1.Client.CreateSandbox(ctx, sdk.CreateSandboxRequest{Node: "n1", Image: "e2b-base", Public: true})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := n1.Client.Exec(ctx, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c",
		`printf '%s' "$1" > /tmp/srv.py && setsid python3 /tmp/srv.py "$2" >/tmp/srv.log 2>&1 </dev/null &`, "sh", frontServer, sb.ID}}); err != nil || st.Code != 0 {
		t.Fatalf("start the server: %+v %v", st, err)
	}

	t.Run("tokens", func(t *testing.T) {
		api3 := tcpClient(t, n3, apiTok)
		sbs, err := api3.ListSandboxes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := nodeOf(sbs, sb.ID); got != "n1" {
			t.Fatalf("n3's list with the API token: sandbox %s on node %q, want n1", sb.ID, got)
		}
		var out bytes.Buffer
		st, err := api3.Exec(ctx, sb.ID, sdk.ExecRequest{Cmd: []string{"cat", "/proc/sys/kernel/hostname"}, Stdout: &out})
		if err != nil || st.Code != 0 {
			t.Fatalf("exec through n3 with the API token: %+v %v", st, err)
		}
		// Stdin and signals take the two-way stream through n3.
		out.Reset()
		st, err = api3.Exec(ctx, sb.ID, sdk.ExecRequest{Cmd: []string{"cat"}, Stdin: strings.NewReader("up and back"), Stdout: &out})
		if err != nil || st.Code != 0 || out.String() != "up and back" {
			t.Fatalf("exec with stdin through n3: %+v %v %q", st, err, out.String())
		}
		sigs := make(chan os.Signal, 1)
		started := make(chan int, 1)
		go func() { <-started; sigs <- syscall.SIGTERM }()
		st, err = api3.Exec(ctx, sb.ID, sdk.ExecRequest{Cmd: []string{"sleep", "60"}, Signals: sigs, Started: func(pid int) { started <- pid }})
		if err != nil || st.Code != 128+int(syscall.SIGTERM) {
			t.Fatalf("exec signalled through n3: %+v %v, want the exit of SIGTERM", st, err)
		}
		// A peer's token is taken for any call.
		if _, err := tcpClient(t, n3, nodesTok).ListSandboxes(ctx); err != nil {
			t.Fatalf("n3 with the cluster token: %v", err)
		}
		if _, err := tcpClient(t, n1, "not-a-token").ListSandboxes(ctx); err == nil || !strings.Contains(err.Error(), "token") {
			t.Fatalf("a wrong token: %v, want a refusal that names the token", err)
		}
	})

	t.Run("ingress", func(t *testing.T) {
		hc := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "tcp", net.JoinHostPort(n3.Addr.String(), "8080"))
			}}}
		base := "http://8000-" + sb.ID + ".clade.test"
		waitFor(t, 60*time.Second, "the sandbox's server through n3's ingress", func() (bool, string) {
			resp, err := hc.Get(base + "/")
			if err != nil {
				return false, err.Error()
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode == 200 && string(b) == "hello from "+sb.ID+"\n", fmt.Sprintf("%d %q", resp.StatusCode, b)
		})
		resp, err := hc.Get(base + "/stream")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		var lines []string
		var at []time.Time
		for {
			l, err := br.ReadString('\n')
			if l != "" {
				lines, at = append(lines, l), append(at, time.Now())
			}
			if err != nil {
				break
			}
		}
		if strings.Join(lines, "") != "one\ntwo\nthree\n" {
			t.Fatalf("streamed %q", lines)
		}
		// Sent two seconds apart: a proxy that buffered the answer would
		// deliver them together.
		if gap := at[2].Sub(at[0]); gap < time.Second {
			t.Fatalf("the first and last lines came %s apart through n3's ingress, want about 2s: the answer was not streamed", gap)
		}
		t.Logf("streamed through n3's ingress: first to last line %s", at[2].Sub(at[0]).Round(time.Millisecond))
	})

	t.Run("e2b", func(t *testing.T) {
		e2b := "http://" + net.JoinHostPort(n3.Addr.String(), "3000")
		var list []struct {
			SandboxID string `json:"sandboxID"`
		}
		e2bJSON(t, "GET", e2b+"/sandboxes", map[string]string{"X-API-KEY": apiTok}, nil, &list)
		found := false
		for _, s := range list {
			found = found || s.SandboxID == sb.ID
		}
		if !found {
			t.Fatalf("n3's E2B list %+v lacks %s (on n1)", list, sb.ID)
		}
		var info struct {
			SandboxID       string `json:"sandboxID"`
			EnvdAccessToken string `json:"envdAccessToken"`
		}
		e2bJSON(t, "GET", e2b+"/sandboxes/"+sb.ID, map[string]string{"X-API-KEY": apiTok}, nil, &info)
		if info.SandboxID != sb.ID {
			t.Fatalf("n3's E2B get: %+v", info)
		}
		// Sandbox.connect: its answer has the envd access token.
		e2bJSON(t, "POST", e2b+"/sandboxes/"+sb.ID+"/connect", map[string]string{"X-API-KEY": apiTok, "Content-Type": "application/json"},
			strings.NewReader(`{"timeout":300}`), &info)
		if info.SandboxID != sb.ID || info.EnvdAccessToken == "" {
			t.Fatalf("n3's E2B connect: %+v", info)
		}
		envd := map[string]string{"E2b-Sandbox-Id": sb.ID, "X-Access-Token": info.EnvdAccessToken}
		content := "written through n3 at " + time.Now().Format(time.RFC3339Nano)
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		fw, err := mw.CreateFormFile("file", "note.txt")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = fw.Write([]byte(content))
		_ = mw.Close()
		h := map[string]string{"Content-Type": mw.FormDataContentType()}
		for k, v := range envd {
			h[k] = v
		}
		e2bJSON(t, "POST", e2b+"/files?path=/home/user/note.txt&username=user", h, &body, nil)
		got := e2bRaw(t, "GET", e2b+"/files?path=/home/user/note.txt&username=user", envd)
		if got != content {
			t.Fatalf("envd download through n3: %q, want %q", got, content)
		}
		// And it is on n1, in the sandbox, owned by user.
		var out bytes.Buffer
		if st, err := n1.Client.Exec(ctx, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "stat -c %U /home/user/note.txt; cat /home/user/note.txt"}, Stdout: &out}); err != nil || st.Code != 0 {
			t.Fatalf("%+v %v", st, err)
		}
		if out.String() != "user\n"+content {
			t.Fatalf("on n1: %q", out.String())
		}
	})

	t.Run("e2b commands", func(t *testing.T) { testE2BCommandsAcross(t, c, sb.ID, apiTok) })
	t.Run("kept routes peer-only", func(t *testing.T) { testKeptRoutesPeerOnly(t, c, sb.ID, apiTok, nodesTok) })

	t.Run("mcp", func(t *testing.T) {
		in := strings.Join([]string{
			`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`,
			`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
			`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"list_sandboxes","arguments":{}}}`,
			fmt.Sprintf(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"run_command","arguments":{"sandbox":%q,"command":"cat /proc/sys/kernel/hostname; echo mcp-through-n3"}}}`, sb.ID),
		}, "\n") + "\n"
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(cctx, n3.Bin, "mcp")
		cmd.Env = append(os.Environ(), "CLADE_HOST="+n3.Socket)
		cmd.Stdin = strings.NewReader(in)
		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("clade mcp: %v\n%s", err, out)
		}
		answers := map[int]string{}
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			var m struct {
				ID     int             `json:"id"`
				Result json.RawMessage `json:"result"`
			}
			if json.Unmarshal([]byte(l), &m) == nil && m.ID != 0 {
				answers[m.ID] = string(m.Result)
			}
		}
		if a := answers[2]; !strings.Contains(a, sb.ID) || !strings.Contains(a, `\"node\":\"n1\"`) && !strings.Contains(a, `"node":"n1"`) {
			t.Fatalf("list_sandboxes through n3 does not show %s on n1: %s", sb.ID, a)
		}
		if a := answers[3]; !strings.Contains(a, "mcp-through-n3") || strings.Contains(a, `"isError":true`) {
			t.Fatalf("run_command through n3: %s", a)
		}
	})
}

func readTok(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// tcpClient is a client of nd's TCP API (--listen) with tok.
func tcpClient(t *testing.T, nd *testenv.NetNode, tok string) *sdk.Client {
	t.Helper()
	cl, err := sdk.New("http://"+nd.API, sdk.WithToken(tok))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

func nodeOf(sbs []sdk.Sandbox, id string) string {
	for _, s := range sbs {
		if s.ID == id {
			return s.Node
		}
	}
	return ""
}

func e2bRaw(t *testing.T, method, url string, h map[string]string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("%s %s: %d %s", method, url, resp.StatusCode, b)
	}
	return string(b)
}

func e2bJSON(t *testing.T, method, url string, h map[string]string, body io.Reader, out any) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		t.Fatalf("%s %s: %d %s", method, url, resp.StatusCode, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, url, err, b)
		}
	}
}

// TestNetClusterBench runs `clade bench --cluster` against three nodes in
// namespaces, from the host's namespace through their TCP APIs, with
// etcd watched: it must finish every case and print its figures and the
// projection (docs/benchmarks.md has them).
func TestNetClusterBench(t *testing.T) {
	c, _ := storeCluster(t, 3, "clade-bench", []string{"--pressure-floor", "-1", "--cluster-lease-ttl", "5s"}, nil)
	var nodes []string
	for _, nd := range c.Nodes {
		nodes = append(nodes, "http://"+nd.API)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.Nodes[0].Bin, "bench", "--cluster", "--nodes", strings.Join(nodes, ","),
		"--etcd", "etcd://"+c.Nodes[0].Etcd, "--storm", "6", "--samples", "60", "--cluster-fork", "3", "--cluster-rounds", "2", "--cluster-hold", "32")
	cmd.Env = append(os.Environ(), "CLADE_TOKEN="+readTok(t, c.Token))
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	t.Logf("clade bench --cluster:\n%s", out)
	if err != nil {
		t.Fatalf("clade bench --cluster: %v", err)
	}
	for _, want := range []string{"on one node (n1)", "across the cluster (through 3 nodes)", "etcd writes per create", "proxied (through n2)",
		"extra hop", "etcd writes per exec", "projection for N nodes", "N=100",
		"fork of 3 (256 MiB sandbox holding 32 MiB), 2 rounds", "each fork child costs",
		"wake (256 MiB sandbox holding 32 MiB), 2 rounds", "on the node that slept it", "other node / local"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the output lacks %q", want)
		}
	}
	// The fork rows: one node's children all on n1, the spread's on two
	// nodes or more, and at most 2 etcd writes per child (the target).
	forks := regexp.MustCompile(`(?m)^(on one node \(n1\)|across the nodes \(--spread\))\s+([0-9]+)\s+([0-9]+)\s+((?:n[0-9]:[0-9]+ ?)+)\s+([0-9.]+)$`).FindAllStringSubmatch(string(out), -1)
	if len(forks) != 2 {
		t.Fatalf("want the two fork rows, got %q", forks)
	}
	if got := strings.TrimSpace(forks[0][4]); got != "n1:6" {
		t.Errorf("the one-node forks' children: %q, want n1:6", got)
	}
	if got := strings.Fields(forks[1][4]); len(got) < 2 {
		t.Errorf("the spread forks' children: %q, want two nodes or more", got)
	}
	for _, f := range forks {
		if w, _ := strconv.ParseFloat(f[5], 64); w < 1 || w > 2 {
			t.Errorf("%s: %s etcd writes per child, want 1 to 2", f[1], f[5])
		}
	}
	if !regexp.MustCompile(`(?m)^on another node \(image from the object store\)\s+[1-9][0-9]*\s+[1-9][0-9]*$`).MatchString(string(out)) {
		t.Errorf("the cross-node wake row lacks its figures")
	}
	// Each latency row's p50 is at most its p95, and both are positive.
	rows := regexp.MustCompile("(?m)^(`true` direct \\(through [^)]*\\), [0-9]+ rounds|`true` proxied \\(through [^)]*\\)|no spawn direct, [0-9]+ rounds|no spawn proxied)\\s+([0-9.]+)\\s+([0-9.]+)$").FindAllStringSubmatch(string(out), -1)
	if len(rows) != 4 {
		t.Fatalf("want the direct and proxied rows of `true` and of an exec without a spawn, with p50 and p95, got %q", rows)
	}
	for _, r := range rows {
		p50, _ := strconv.ParseFloat(r[2], 64)
		p95, _ := strconv.ParseFloat(r[3], 64)
		if !(p50 > 0 && p50 <= p95) {
			t.Errorf("%s: p50 %s, p95 %s", r[1], r[2], r[3])
		}
	}
	// Everything it made is gone.
	sbs, err := c.Nodes[0].Client.ListSandboxes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(sbs) != 0 {
		t.Errorf("%d sandboxes left after the bench: %+v", len(sbs), sbs)
	}
}
