package cluster_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/clade-sandbox/clade/internal/front/e2b/envdpb/process"
	"github.com/clade-sandbox/clade/internal/front/e2b/envdpb/process/processconnect"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// envdHeaders adds envd's headers (the sandbox, its access token) to
// every request.
type envdHeaders struct {
	h  map[string]string
	rt http.RoundTripper
}

func (e envdHeaders) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range e.h {
		r.Header.Set(k, v)
	}
	return e.rt.RoundTrip(r)
}

// envdProcess is a client of envd's process service on nd's E2B front.
func envdProcess(nd *testenv.NetNode, h map[string]string) processconnect.ProcessClient {
	return processconnect.NewProcessClient(&http.Client{Transport: envdHeaders{h: h, rt: http.DefaultTransport}},
		"http://"+net.JoinHostPort(nd.Addr.String(), "3000"), connect.WithProtoJSON())
}

// testE2BCommandsAcross drives E2B's commands on sandbox id (held by n1)
// through n3's and n2's E2B fronts: commands.run through n3 (a kept
// command started on n1 through the peer-only exec), then a background
// command started through n3, listed and connected by pid through n2 (the
// kept list and attach on n1) and killed through n2.
func testE2BCommandsAcross(t *testing.T, c *testenv.NetCluster, id, apiTok string) {
	n2, n3 := c.Nodes[1], c.Nodes[2]
	ctx := t.Context()
	var info struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	e2bJSON(t, "POST", "http://"+net.JoinHostPort(n3.Addr.String(), "3000")+"/sandboxes/"+id+"/connect",
		map[string]string{"X-API-KEY": apiTok, "Content-Type": "application/json"}, strings.NewReader(`{"timeout":300}`), &info)
	envd := map[string]string{"E2b-Sandbox-Id": id, "X-Access-Token": info.EnvdAccessToken}
	pc3, pc2 := envdProcess(n3, envd), envdProcess(n2, envd)

	// commands.run: output, stderr and the exit code come back through n3.
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	st, err := pc3.Start(rctx, connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/sh",
		Args: []string{"-c", "cat /proc/sys/kernel/hostname; echo run-through-n3; echo to-stderr >&2; exit 3"}}}))
	if err != nil {
		t.Fatalf("commands.run through n3: %v", err)
	}
	var stdout, stderr bytes.Buffer
	var end *process.ProcessEvent_EndEvent
	var pid uint32
	for st.Receive() {
		switch ev := st.Msg().GetEvent().GetEvent().(type) {
		case *process.ProcessEvent_Start:
			pid = ev.Start.GetPid()
		case *process.ProcessEvent_Data:
			stdout.Write(ev.Data.GetStdout())
			stderr.Write(ev.Data.GetStderr())
		case *process.ProcessEvent_End:
			end = ev.End
		}
	}
	if err := st.Err(); err != nil {
		t.Fatalf("commands.run through n3: %v (stdout %q)", err, stdout.String())
	}
	st.Close()
	if pid == 0 || end == nil || !end.GetExited() || end.GetExitCode() != 3 {
		t.Fatalf("commands.run through n3: pid %d, end %v: want a start and an exit of 3", pid, end)
	}
	if !strings.HasSuffix(stdout.String(), "\nrun-through-n3\n") || stderr.String() != "to-stderr\n" {
		t.Fatalf("commands.run through n3: stdout %q, stderr %q", stdout.String(), stderr.String())
	}
	t.Logf("commands.run through n3 ran on %s", strings.TrimSpace(strings.SplitN(stdout.String(), "\n", 2)[0]))

	// A background command started through n3; its stream is then
	// dropped (handle.disconnect()): it runs on, on n1.
	bctx, bcancel := context.WithCancel(ctx)
	tag := "bg-across"
	bst, err := pc3.Start(bctx, connect.NewRequest(&process.StartRequest{Tag: &tag, Process: &process.ProcessConfig{Cmd: "/bin/sh",
		Args: []string{"-c", "i=0; while :; do echo tick$i; i=$((i+1)); sleep 0.2; done"}}}))
	if err != nil {
		t.Fatalf("background command through n3: %v", err)
	}
	pid = 0
	for pid == 0 && bst.Receive() {
		pid = bst.Msg().GetEvent().GetStart().GetPid()
	}
	bcancel()
	bst.Close()
	if pid == 0 {
		t.Fatalf("background command through n3: no start event: %v", bst.Err())
	}

	// commands.list through n2, which has no stream of it: n1's kept list.
	lres, err := pc2.List(ctx, connect.NewRequest(&process.ListRequest{}))
	if err != nil {
		t.Fatalf("commands.list through n2: %v", err)
	}
	var listed *process.ProcessInfo
	for _, p := range lres.Msg.GetProcesses() {
		if p.GetPid() == pid {
			listed = p
		}
	}
	if listed == nil || listed.GetConfig().GetCmd() != "/bin/sh" || listed.GetTag() != tag ||
		len(listed.GetConfig().GetArgs()) != 2 || !strings.Contains(listed.GetConfig().GetArgs()[1], "tick") {
		t.Fatalf("commands.list through n2: %v, want pid %d (/bin/sh, tag %q)", lres.Msg.GetProcesses(), pid, tag)
	}

	// commands.connect(pid) through n2: attached on n1, its output flows.
	cctx, ccancel := context.WithTimeout(ctx, 2*time.Minute)
	defer ccancel()
	cst, err := pc2.Connect(cctx, connect.NewRequest(&process.ConnectRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}}))
	if err != nil {
		t.Fatalf("commands.connect(%d) through n2: %v", pid, err)
	}
	defer cst.Close()
	var seen bytes.Buffer
	for !strings.Contains(seen.String(), "tick") && cst.Receive() {
		seen.Write(cst.Msg().GetEvent().GetData().GetStdout())
	}
	if !strings.Contains(seen.String(), "tick") {
		t.Fatalf("commands.connect(%d) through n2: no output (%q): %v", pid, seen.String(), cst.Err())
	}
	// handle.kill() through n2: the connected stream ends with the kill.
	if _, err := pc2.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}},
		Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatalf("kill %d through n2: %v", pid, err)
	}
	end = nil
	for cst.Receive() {
		if e := cst.Msg().GetEvent().GetEnd(); e != nil {
			end = e
		}
	}
	if end == nil || end.GetExited() || !strings.Contains(end.GetStatus(), "killed") {
		t.Fatalf("commands.connect(%d) through n2 after the kill: end %v (%v), want killed", pid, end, cst.Err())
	}
	// It leaves the list (through either node).
	for _, pc := range []processconnect.ProcessClient{pc2, pc3} {
		waitFor(t, 60*time.Second, "the killed command to leave the list", func() (bool, string) {
			res, err := pc.List(ctx, connect.NewRequest(&process.ListRequest{}))
			if err != nil {
				return false, err.Error()
			}
			for _, p := range res.Msg.GetProcesses() {
				if p.GetPid() == pid {
					return false, "still listed"
				}
			}
			return true, ""
		})
	}
}

// testKeptRoutesPeerOnly: the kept routes between nodes take the cluster
// token only; the users' API token and the unix socket get 401.
func testKeptRoutesPeerOnly(t *testing.T, c *testenv.NetCluster, id, apiTok, nodesTok string) {
	n1 := c.Nodes[0]
	ctx := t.Context()
	for name, cl := range map[string]*sdk.Client{"API token": tcpClient(t, n1, apiTok), "unix socket": n1.Client} {
		_, err := cl.Peer().KeptCommands(ctx, id, false)
		if !isPeerRefusal(err) {
			t.Errorf("%s: the kept list: %v, want 401 naming the cluster token", name, err)
		}
		_, err = cl.Exec(ctx, id, sdk.ExecRequest{Cmd: []string{"true"}, Keep: true, Tag: "x"})
		if !isPeerRefusal(err) {
			t.Errorf("%s: an exec with keep: %v, want 401 naming the cluster token", name, err)
		}
		_, err = cl.Peer().Attach(ctx, id, 1, false, sdk.ExecRequest{})
		if !isPeerRefusal(err) {
			t.Errorf("%s: an attach: %v, want 401 naming the cluster token", name, err)
		}
	}
	// The public exec refuses keep with a 400 that says why.
	req, err := http.NewRequestWithContext(ctx, "POST", "http://"+n1.API+"/v1/sandboxes/"+id+"/exec", strings.NewReader(`{"cmd":["true"],"keep":true}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+apiTok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "keep") {
		t.Fatalf("the public exec with keep: %d %s, want 400 naming keep", resp.StatusCode, b)
	}
	// With the cluster token they serve: a kept command (its stdin
	// open) started, detached, listed and attached to on n1.
	peer := tcpClient(t, n1, nodesTok)
	started := make(chan int, 1)
	kctx, kcancel := context.WithCancel(ctx)
	kdone := make(chan error, 1)
	inR, inW := io.Pipe()
	go func() {
		_, err := peer.Exec(kctx, id, sdk.ExecRequest{Cmd: []string{"sh", "-c", "read x; echo got-$x"}, Keep: true, Tag: "peer-tag",
			Stdin: inR, Started: func(pid int) { started <- pid }})
		kdone <- err
	}()
	var pid int
	select {
	case pid = <-started:
	case err := <-kdone:
		t.Fatalf("an exec with keep and the cluster token: %v", err)
	}
	kcancel() // detaches: it runs on
	<-kdone
	inW.CloseWithError(errors.New("detached"))
	kept, err := peer.Peer().KeptCommands(ctx, id, false)
	if err != nil {
		t.Fatalf("the kept list with the cluster token: %v", err)
	}
	found := false
	for _, k := range kept {
		found = found || k.PID == pid && k.Tag == "peer-tag" && k.Exit == nil && k.Stdin
	}
	if !found {
		t.Fatalf("the kept list %+v lacks pid %d (tag peer-tag, running)", kept, pid)
	}
	var out bytes.Buffer
	st, err := peer.Peer().Attach(ctx, id, pid, false, sdk.ExecRequest{Stdin: strings.NewReader("line\n"), Stdout: &out})
	if err != nil || st.Code != 0 || out.String() != "got-line\n" {
		t.Fatalf("attach with the cluster token: %+v %v, output %q", st, err, out.String())
	}
	// Collected: a second attach is not found.
	if _, err := peer.Peer().Attach(ctx, id, pid, false, sdk.ExecRequest{}); !sdk.IsNotFound(err) {
		t.Fatalf("a second attach to the ended %d: %v, want not found", pid, err)
	}
}

func isPeerRefusal(err error) bool {
	var e *sdk.Error
	return errors.As(err, &e) && e.Status == http.StatusUnauthorized && strings.Contains(e.Message, "cluster token")
}
