package e2b_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/clade-sandbox/clade/internal/front/e2b/envdpb/filesystem"
	"github.com/clade-sandbox/clade/internal/front/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/clade-sandbox/clade/internal/front/e2b/envdpb/process"
	"github.com/clade-sandbox/clade/internal/front/e2b/envdpb/process/processconnect"
)

// headers adds fixed headers to every request, as the SDKs do.
type headers struct {
	h  map[string]string
	rt http.RoundTripper
}

func (t headers) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range t.h {
		r.Header.Set(k, v)
	}
	return t.rt.RoundTrip(r)
}

func client(h map[string]string) *http.Client {
	return &http.Client{Transport: headers{h: h, rt: http.DefaultTransport}}
}

// rest calls the REST API and decodes the JSON answer into out (if not nil).
func rest(t testing.TB, method, url, key string, body any, out any) (int, http.Header) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-KEY", key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v in %q", method, url, err, b)
		}
	}
	return res.StatusCode, res.Header
}

type created struct {
	SandboxID       string `json:"sandboxID"`
	EnvdAccessToken string `json:"envdAccessToken"`
	EnvdVersion     string `json:"envdVersion"`
	TemplateID      string `json:"templateID"`
}

type apiErr struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// TestEnvdProtocol checks what the SDK test cannot see well: the envd
// token, keepalives at the asked interval, the stream deadline bounding a
// command, the binary protobuf codec, and error codes.
func TestEnvdProtocol(t *testing.T) {
	t.Parallel() // a daemon of its own (startE2B)
	_, url, key := startE2B(t)
	var sb created
	if st, _ := rest(t, "POST", url+"/sandboxes", key, map[string]any{"templateID": "base", "timeout": 120}, &sb); st != http.StatusCreated {
		t.Fatalf("create: status %d", st)
	}
	if sb.EnvdVersion == "" || sb.EnvdAccessToken == "" || sb.TemplateID != "base" {
		t.Fatalf("create answered %+v", sb)
	}
	envd := map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "49983", "X-Access-Token": sb.EnvdAccessToken}
	ctx := context.Background()

	t.Run("access token", func(t *testing.T) {
		for name, h := range map[string]map[string]string{
			"none":          {"E2b-Sandbox-Id": sb.SandboxID},
			"wrong":         {"E2b-Sandbox-Id": sb.SandboxID, "X-Access-Token": "nope"},
			"other sandbox": {"E2b-Sandbox-Id": sb.SandboxID + "0", "X-Access-Token": sb.EnvdAccessToken},
		} {
			pc := processconnect.NewProcessClient(client(h), url, connect.WithProtoJSON())
			_, err := pc.List(ctx, connect.NewRequest(&process.ListRequest{}))
			if connect.CodeOf(err) != connect.CodeUnauthenticated {
				t.Errorf("%s: List answered %v, want unauthenticated", name, err)
			}
		}
	})

	// The binary protobuf codec (the SDKs use JSON) serves the same calls.
	pc := processconnect.NewProcessClient(client(envd), url)
	fc := filesystemconnect.NewFilesystemClient(client(envd), url, connect.WithProtoJSON())

	t.Run("keepalive", func(t *testing.T) {
		req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "sleep 2.5; echo done"}}})
		req.Header().Set("Keepalive-Ping-Interval", "1")
		st, err := pc.Start(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		var kinds []string
		var out string
		for st.Receive() {
			switch ev := st.Msg().GetEvent().GetEvent().(type) {
			case *process.ProcessEvent_Start:
				kinds = append(kinds, "start")
			case *process.ProcessEvent_Keepalive:
				kinds = append(kinds, "keepalive")
			case *process.ProcessEvent_Data:
				out += string(ev.Data.GetStdout())
			case *process.ProcessEvent_End:
				kinds = append(kinds, "end")
				if !ev.End.GetExited() || ev.End.GetExitCode() != 0 || ev.End.GetStatus() != "exit status 0" {
					t.Errorf("end event %v", ev.End)
				}
			}
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		if len(kinds) < 3 || kinds[0] != "start" || kinds[1] != "keepalive" || kinds[len(kinds)-1] != "end" || out != "done\n" {
			t.Fatalf("events %v, stdout %q: want start, keepalives, end", kinds, out)
		}
	})

	t.Run("stream deadline bounds the command", func(t *testing.T) {
		// The deadline also covers the start, which a loaded host can be
		// slow to answer: it must come before the deadline.
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		st, err := pc.Start(dctx, connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "sleep", Args: []string{"600"}}}))
		if err != nil {
			t.Fatal(err)
		}
		if !st.Receive() {
			t.Fatalf("no start event: %v", st.Err())
		}
		pid := st.Msg().GetEvent().GetStart().GetPid()
		var end *process.ProcessEvent_EndEvent
		for st.Receive() {
			if e := st.Msg().GetEvent().GetEnd(); e != nil {
				end = e
			}
		}
		st.Close()
		// The command is killed at the deadline whether or not the end
		// event made it before the client gave up: it leaves the list.
		deadline := time.Now().Add(15 * time.Second)
		for {
			res, err := pc.List(ctx, connect.NewRequest(&process.ListRequest{}))
			if err != nil {
				t.Fatal(err)
			}
			alive := false
			for _, p := range res.Msg.GetProcesses() {
				alive = alive || p.GetPid() == pid
			}
			if !alive {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pid %d still runs 15s after its 5s deadline (end event %v)", pid, end)
			}
			time.Sleep(100 * time.Millisecond) // polling the process list
		}
		if end != nil && end.GetExited() {
			t.Errorf("the command exited by itself: %v", end)
		}
	})

	t.Run("errors", func(t *testing.T) {
		_, err := fc.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: "/no/such/path"}))
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("Stat of a missing path: %v, want not_found", err)
		}
		if _, err := fc.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: "/tmp"})); connect.CodeOf(err) != connect.CodeAlreadyExists {
			t.Errorf("MakeDir of /tmp: %v, want already_exists", err)
		}
		_, err = pc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 999999}}, Signal: process.Signal_SIGNAL_SIGKILL}))
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("SendSignal to no process: %v, want not_found", err)
		}
		st, err := pc.Start(ctx, connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/no/such/cmd"}}))
		if err != nil {
			t.Fatal(err)
		}
		var end *process.ProcessEvent_EndEvent
		for st.Receive() {
			if e := st.Msg().GetEvent().GetEnd(); e != nil {
				end = e
			}
		}
		st.Close()
		if end == nil || end.GetExitCode() != 127 {
			t.Errorf("a missing command ended %v, want exit code 127", end)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		hc := client(envd)
		for _, tc := range []struct {
			method, path, ctype, body string
			want                      int
		}{
			{"POST", "/files", "application/octet-stream", "data", http.StatusBadRequest},                           // no ?path=
			{"POST", "/files?path=/", "application/octet-stream", "data", http.StatusBadRequest},                    // the root
			{"POST", "/files?path=/etc/hostname/x", "application/octet-stream", "data", http.StatusBadRequest},      // parent is a file
			{"POST", "/files?path=/tmp/x", "multipart/form-data; boundary=zz", "--zz--\r\n", http.StatusBadRequest}, // no file part
			{"POST", "/files?path=/tmp/x", "application/octet-stream; x", "data", http.StatusOK},
			{"GET", "/files?path=/tmp", "", "", http.StatusBadRequest}, // a directory
			{"GET", "/files?path=/no/such", "", "", http.StatusNotFound},
			{"GET", "/nowhere", "", "", http.StatusNotFound},
		} {
			req, _ := http.NewRequest(tc.method, url+tc.path, strings.NewReader(tc.body))
			if tc.ctype != "" {
				req.Header.Set("Content-Type", tc.ctype)
			}
			res, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var e apiErr
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != tc.want {
				t.Errorf("%s %s: %d %s, want %d", tc.method, tc.path, res.StatusCode, b, tc.want)
			} else if tc.want >= 400 && (json.Unmarshal(b, &e) != nil || e.Code != tc.want || e.Message == "") {
				t.Errorf("%s %s: body %q is not E2B's error body", tc.method, tc.path, b)
			}
		}
		var e apiErr
		req, _ := http.NewRequest("POST", url+"/v2/sandboxes", strings.NewReader("{not json"))
		req.Header.Set("X-API-KEY", key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = json.NewDecoder(res.Body).Decode(&e)
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest || e.Code != 400 {
			t.Errorf("create with a malformed body: %d %+v", res.StatusCode, e)
		}
	})

	t.Run("rest errors", func(t *testing.T) {
		var e apiErr
		if st, _ := rest(t, "GET", url+"/sandboxes/0123456789abcdef", key, nil, &e); st != http.StatusNotFound || e.Code != 404 || e.Message == "" {
			t.Errorf("info of a missing sandbox: %d %+v", st, e)
		}
		e = apiErr{}
		if st, _ := rest(t, "POST", url+"/v2/sandboxes", key, map[string]any{"templateID": "no-such-template"}, &e); st != http.StatusNotFound || !strings.Contains(e.Message, "no-such-template") {
			t.Errorf("create from a missing template: %d %+v", st, e)
		}
		e = apiErr{}
		if st, _ := rest(t, "POST", url+"/sandboxes/"+sb.SandboxID+"/timeout", key, map[string]any{"timeout": -1}, &e); st != http.StatusBadRequest || e.Code != 400 {
			t.Errorf("a negative timeout: %d %+v", st, e)
		}
	})
}

// TestListPaging pages through sandboxes with limit and X-Next-Token, and
// checks the older /sandboxes routes.
func TestListPaging(t *testing.T) {
	t.Parallel() // a daemon of its own (startE2B)
	_, url, key := startE2B(t)
	ids := map[string]bool{}
	for i := range 3 {
		var sb created
		path := "/v2/sandboxes"
		if i == 0 {
			path = "/sandboxes"
		}
		if st, _ := rest(t, "POST", url+path, key, map[string]any{"metadata": map[string]string{"group": "paging"}}, &sb); st != http.StatusCreated {
			t.Fatalf("create %d: status %d", i, st)
		}
		ids[sb.SandboxID] = true
	}
	seen := map[string]bool{}
	next := ""
	for page := 0; ; page++ {
		if page > 3 {
			t.Fatal("paging does not end")
		}
		var list []created
		q := "/v2/sandboxes?limit=2&metadata=group%3Dpaging"
		if next != "" {
			q += "&nextToken=" + next
		}
		st, h := rest(t, "GET", url+q, key, nil, &list)
		if st != http.StatusOK {
			t.Fatalf("list: status %d", st)
		}
		if len(list) > 2 {
			t.Fatalf("page %d has %d sandboxes, limit 2", page, len(list))
		}
		for _, sb := range list {
			if seen[sb.SandboxID] {
				t.Fatalf("sandbox %s on two pages", sb.SandboxID)
			}
			seen[sb.SandboxID] = true
		}
		if next = h.Get("X-Next-Token"); next == "" {
			break
		}
	}
	if len(seen) != 3 {
		t.Fatalf("paging saw %v, want %v", seen, ids)
	}
	var v1 []created
	if st, _ := rest(t, "GET", url+"/sandboxes?metadata=group%3Dpaging", key, nil, &v1); st != http.StatusOK || len(v1) != 3 {
		t.Fatalf("GET /sandboxes: %d, %d sandboxes", st, len(v1))
	}
	// A client that kills what each page lists: the next page still
	// starts after the last one's place (the token named a sandbox, and
	// once it was gone the next page was empty, the rest never listed).
	var first []created
	st, h := rest(t, "GET", url+"/v2/sandboxes?limit=2&order=asc&metadata=group%3Dpaging", key, nil, &first)
	if st != http.StatusOK || len(first) != 2 || h.Get("X-Next-Token") == "" {
		t.Fatalf("first page: %d %+v %q", st, first, h.Get("X-Next-Token"))
	}
	for _, sb := range first {
		if st, _ := rest(t, "DELETE", url+"/sandboxes/"+sb.SandboxID, key, nil, nil); st != http.StatusNoContent {
			t.Fatalf("kill %s: %d", sb.SandboxID, st)
		}
	}
	var rest2 []created
	if st, _ := rest(t, "GET", url+"/v2/sandboxes?limit=2&order=asc&metadata=group%3Dpaging&nextToken="+h.Get("X-Next-Token"), key, nil, &rest2); st != http.StatusOK || len(rest2) != 1 || rest2[0].SandboxID == first[0].SandboxID || rest2[0].SandboxID == first[1].SandboxID {
		t.Fatalf("the page after killing the first page's sandboxes: %d %+v, want the third sandbox", st, rest2)
	}
	var e apiErr
	if st, _ := rest(t, "GET", url+"/v2/sandboxes?nextToken=nonsense", key, nil, &e); st != http.StatusBadRequest || !strings.Contains(e.Message, "nextToken") {
		t.Fatalf("a bad nextToken: %d %+v", st, e)
	}
	if st, _ := rest(t, "GET", url+"/v2/sandboxes?state=dead", key, nil, &e); st != http.StatusBadRequest || e.Code != 400 {
		t.Fatalf("a bad state filter: %d %+v", st, e)
	}
	if st, _ := rest(t, "GET", url+"/v2/sandboxes", "wrong", nil, &e); st != http.StatusUnauthorized || e.Code != 401 {
		t.Fatalf("a wrong key: %d %+v", st, e)
	}
}
