package cluster_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// eventTail collects a followed stream's events as they arrive.
type eventTail struct {
	t   *testing.T
	c   chan sdk.Event
	err chan error
	all []sdk.Event // what next has seen, in order
}

func followEvents(t *testing.T, ctx context.Context, c *sdk.Client, f sdk.EventFilter) *eventTail {
	t.Helper()
	f.Follow = true
	evs, err := c.Events(ctx, f)
	if err != nil {
		t.Fatalf("events %+v: %v", f, err)
	}
	et := &eventTail{t: t, c: make(chan sdk.Event, 4096), err: make(chan error, 1)}
	go func() {
		for e, err := range evs {
			if err != nil {
				et.err <- err
				return
			}
			et.c <- e
		}
	}()
	return et
}

// await returns the first event (after those already seen) that match
// takes, within timeout.
func (et *eventTail) await(what string, timeout time.Duration, match func(sdk.Event) bool) sdk.Event {
	et.t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case e := <-et.c:
			et.all = append(et.all, e)
			if match(e) {
				return e
			}
		case err := <-et.err:
			et.t.Fatalf("%s: the stream ended: %v (events seen: %s)", what, err, eventList(et.all))
		case <-deadline:
			et.t.Fatalf("%s: not within %s (events seen: %s)", what, timeout, eventList(et.all))
		}
	}
}

func eventList(evs []sdk.Event) string {
	var b strings.Builder
	for _, e := range evs {
		b.WriteString(" " + e.Node + ":" + e.Type + ":" + e.Sandbox)
	}
	return b.String()
}

func statsByID(sts []sdk.SandboxStats) map[string]sdk.SandboxStats {
	out := map[string]sdk.SandboxStats{}
	for _, s := range sts {
		out[s.ID] = s
	}
	return out
}

// TestNetClusterEvents: three daemons in network namespaces. A merged
// event stream through n3 (GET /v1/events?cluster=true) carries the
// creates made on n1 and on n2, each with its node, and a stream of one
// sandbox through n3 the events of that sandbox only, from the node that
// holds it; the kept events of every node come without follow. n3's
// GET /v1/stats lists the sandboxes of all nodes with their use and node
// (and `clade stats` a NODE column); with n2's API silenced (its
// packets dropped; its lease and etcd member live on) the answer comes
// within the wait and says n2 did not answer in n2's sandbox's reading,
// not by failing, and the stream carries n2's events once it answers. n2 SIGKILLed: its
// part of the stream ends with node.left once its lease lapses, its
// running sandbox's record marked lost is said once (a `lost` event from
// the node that marked it, with the reason), and the stream goes on (a
// later create on n1 arrives); n2 restarted is picked up again
// (node.joined).
func TestNetClusterEvents(t *testing.T) {
	c := testenv.StartNetCluster(t, 3, nil, nil)
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	all := followEvents(t, ctx, n3.Client, sdk.EventFilter{Cluster: true})
	sb1, err := n1.Client.CreateSandbox(ctx, sdk.CreateSandboxRequest{Name: "ev1", Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	one := followEvents(t, ctx, n3.Client, sdk.EventFilter{Cluster: true, Sandbox: "ev1"})
	sb2, err := n1.Client.CreateSandbox(ctx, sdk.CreateSandboxRequest{Name: "ev2", Node: "n2"})
	if err != nil {
		t.Fatal(err)
	}
	if sb1.Node != "n1" || sb2.Node != "n2" {
		t.Fatalf("created on %s and %s, want n1 and n2", sb1.Node, sb2.Node)
	}
	for _, sb := range []sdk.Sandbox{sb1, sb2} {
		e := all.await("created "+sb.ID+" through n3", time.Minute, func(e sdk.Event) bool {
			return e.Type == api.EventCreated && e.Sandbox == sb.ID
		})
		if e.Node != sb.Node || e.Seq == 0 {
			t.Fatalf("created %s: node %q seq %d, want node %s and its seq", sb.ID, e.Node, e.Seq, sb.Node)
		}
	}
	t.Logf("creates on n1 and n2 arrived through n3")

	// The one sandbox's stream: an exec in each, only ev1's arrives.
	for _, sb := range []sdk.Sandbox{sb2, sb1} {
		if res, err := n3.Client.Exec(ctx, sb.ID, sdk.ExecRequest{Cmd: []string{"true"}}); err != nil || res.Code != 0 {
			t.Fatalf("exec in %s: %+v %v", sb.ID, res, err)
		}
	}
	answered := time.Now()
	e := one.await("ev1's exec through n3", time.Minute, func(e sdk.Event) bool { return e.Type == api.EventExecEnded })
	t.Logf("ev1's exec.ended through n3's merged stream %s after the exec answered", time.Since(answered).Round(time.Microsecond))
	if e.Sandbox != sb1.ID || e.Node != "n1" {
		t.Fatalf("ev1's stream: %s of %s on %q", e.Type, e.Sandbox, e.Node)
	}
	for _, e := range one.all {
		if e.Sandbox != sb1.ID {
			t.Fatalf("ev1's stream carried %s of %s on %s", e.Type, e.Sandbox, e.Node)
		}
	}

	// The kept events, without follow, of every node.
	kept, err := n3.Client.Events(ctx, sdk.EventFilter{Cluster: true})
	if err != nil {
		t.Fatal(err)
	}
	nodesOf := map[string]string{}
	for e, err := range kept {
		if err != nil {
			t.Fatal(err)
		}
		if e.Type == api.EventCreated {
			nodesOf[e.Sandbox] = e.Node
		}
	}
	if nodesOf[sb1.ID] != "n1" || nodesOf[sb2.ID] != "n2" {
		t.Fatalf("kept events through n3: creates on %v", nodesOf)
	}

	// Stats through n3: both, with their node and use.
	sts, err := n3.Client.StatsList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := statsByID(sts)
	for _, sb := range []sdk.Sandbox{sb1, sb2} {
		if s := got[sb.ID]; s.Node != sb.Node || s.State != "running" || s.MemoryBytes == 0 || s.Pids < 1 || s.Error != "" {
			t.Fatalf("stats through n3 of %s: %+v (all: %+v)", sb.ID, s, sts)
		}
	}
	// Named ones, each read on its node.
	named, err := n3.Client.StatsList(ctx, "ev2", sb1.ID)
	if err != nil || len(named) != 2 || named[0].ID != sb2.ID || named[0].Node != "n2" || named[0].MemoryBytes == 0 ||
		named[1].ID != sb1.ID || named[1].Node != "n1" || named[1].MemoryBytes == 0 {
		t.Fatalf("stats of ev2 and ev1 through n3: %+v %v", named, err)
	}
	if _, err := n3.Client.StatsList(ctx, "ev2", "no-such-box"); !sdk.IsNotFound(err) {
		t.Fatalf("stats of an unknown sandbox through n3: %v, want not found", err)
	}
	cmd := exec.Command(n3.Bin, "stats", "--no-stream", "--interval", "100ms")
	cmd.Env = append(os.Environ(), "CLADE_HOST="+n3.Socket)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("clade stats through n3: %v: %s", err, errb.String())
	}
	if lines := strings.Split(out.String(), "\n"); !strings.Contains(lines[0], "NODE") || !strings.Contains(out.String(), "ev2") {
		t.Fatalf("clade stats through n3 has no NODE column or misses ev2:\n%s", out.String())
	}

	// n2's API silenced (its packets dropped): n2 and its lease live on,
	// its API answers nothing.
	undo := silence(t, n2.NS, 7070)
	start := time.Now()
	sts, err = n3.Client.StatsList(ctx)
	took := time.Since(start)
	named, nerr := n3.Client.StatsList(ctx, "ev2")
	// The merged stream says n2 does not answer, its lease live (the
	// probe of its API), without waiting for the lease.
	quiet := all.await("node.left of silent n2", time.Minute, func(e sdk.Event) bool { return e.Type == api.EventNodeLeft && e.Node == "n2" })
	silentFor := time.Since(start)
	undo()
	if !strings.Contains(quiet.Reason, "does not answer") || !strings.Contains(quiet.Reason, "lease is live") {
		t.Fatalf("node.left of silent n2 says %q", quiet.Reason)
	}
	back := all.await("node.joined of n2 answering again", time.Minute, func(e sdk.Event) bool { return e.Type == api.EventNodeJoined && e.Node == "n2" })
	if !strings.Contains(back.Reason, "answers again") {
		t.Fatalf("node.joined of n2 after its silence says %q", back.Reason)
	}
	t.Logf("silent n2 (its lease live) said in the merged stream within %s: %s; then: %s", silentFor.Round(time.Millisecond), quiet.Reason, back.Reason)
	if nerr != nil || len(named) != 1 || named[0].Node != "n2" || !strings.Contains(named[0].Error, "did not answer") {
		t.Fatalf("stats of ev2 through n3 with n2 silent: %+v %v", named, nerr)
	}
	if err != nil {
		t.Fatalf("stats through n3 with n2 silent: %v", err)
	}
	got = statsByID(sts)
	if s := got[sb2.ID]; s.Node != "n2" || !strings.Contains(s.Error, "did not answer") {
		t.Fatalf("stats through n3 with n2 silent, ev2: %+v (all: %+v)", s, sts)
	}
	if s := got[sb1.ID]; s.MemoryBytes == 0 || s.Error != "" {
		t.Fatalf("stats through n3 with n2 silent, ev1: %+v (all: %+v)", s, sts)
	}
	if took > 8*time.Second {
		t.Fatalf("stats through n3 with n2 silent took %s", took)
	}
	t.Logf("stats with n2 silent answered in %s: %s", took.Round(time.Millisecond), got[sb2.ID].Error)
	// The merged stream's part of n2 may have failed meanwhile; it is
	// picked up again and carries n2's events.
	if res, err := n1.Client.Exec(ctx, sb2.ID, sdk.ExecRequest{Cmd: []string{"true"}}); err != nil || res.Code != 0 {
		t.Fatalf("exec in ev2 after n2 answers again: %+v %v", res, err)
	}
	all.await("ev2's exec after n2 answers again", time.Minute, func(e sdk.Event) bool {
		return e.Type == api.EventExecEnded && e.Sandbox == sb2.ID && e.Node == "n2"
	})

	// n2 killed: its part ends, the stream goes on.
	killed := time.Now()
	c.Kill(1)
	left := all.await("node.left of n2", time.Minute, func(e sdk.Event) bool { return e.Type == api.EventNodeLeft && e.Node == "n2" })
	t.Logf("n2's part ended %s after its SIGKILL (lease 4 s): %s", time.Since(killed).Round(time.Millisecond), left.Reason)
	// Its lease lapses, or (first) the probe of its API finds nothing
	// listening: either ends its part.
	if !strings.Contains(left.Reason, "left the cluster") && !strings.Contains(left.Reason, "does not answer") {
		t.Fatalf("node.left of n2 says %q", left.Reason)
	}
	// In the cluster's words (its name and address), not the SDK's for
	// a CLI user with a daemon of their own.
	if strings.Contains(left.Reason, "clade daemon") || strings.Contains(left.Reason, "CLADE_HOST") ||
		strings.Contains(left.Reason, "does not answer") && !strings.Contains(left.Reason, "node n2 at ") {
		t.Fatalf("node.left of n2 says %q: not in the cluster's words", left.Reason)
	}
	// Its lease lapsed, its running sandbox is lost: one event says so,
	// from the node that marked it (n1 or n3), with the reason.
	lost := all.await("lost of ev2 after n2's lease lapsed", time.Minute, func(e sdk.Event) bool {
		return e.Type == api.EventLost && e.Sandbox == sb2.ID
	})
	if lost.Node == "n2" || lost.Node == "" || lost.Seq == 0 || lost.Name != "ev2" || !strings.Contains(lost.Reason, "node n2 left the cluster") {
		t.Fatalf("lost of ev2: %+v", lost)
	}
	t.Logf("ev2 lost %s after n2's SIGKILL, said by %s: %s", time.Since(killed).Round(time.Millisecond), lost.Node, lost.Reason)
	sb3, err := n3.Client.CreateSandbox(ctx, sdk.CreateSandboxRequest{Name: "ev3", Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	all.await("created ev3 after n2 left", time.Minute, func(e sdk.Event) bool {
		return e.Type == api.EventCreated && e.Sandbox == sb3.ID && e.Node == "n1"
	})
	for _, e := range all.all {
		if e.Type == api.EventLost && e.Sandbox == sb2.ID && e.Seq != lost.Seq {
			t.Fatalf("ev2 said lost twice: %s", eventList(all.all))
		}
	}
	sts, err = n3.Client.StatsList(ctx)
	if err != nil {
		t.Fatalf("stats through n3 with n2 gone: %v", err)
	}
	got = statsByID(sts)
	if s := got[sb2.ID]; s.Node != "n2" || s.MemoryBytes != 0 {
		t.Fatalf("stats through n3 with n2 gone, ev2: %+v", s)
	}
	if s := got[sb3.ID]; s.Node != "n1" || s.MemoryBytes == 0 {
		t.Fatalf("stats through n3 with n2 gone, ev3: %+v", s)
	}

	// n2 back: picked up again.
	c.Restart(1)
	joined := all.await("node.joined of n2", time.Minute, func(e sdk.Event) bool { return e.Type == api.EventNodeJoined && e.Node == "n2" })
	t.Logf("n2's part began again: %s", joined.Reason)
}

// silence drops every TCP packet to port in the network namespace ns
// (nftables, an input chain of a table of the test's): the node's API
// there answers nothing while it and its etcd member go on. It returns
// the undo.
func silence(t *testing.T, ns string, port uint16) (undo func()) {
	t.Helper()
	fd, err := unix.Open(ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	tbl := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "clade_test_silence"})
	ch := conn.AddChain(&nftables.Chain{Name: "in", Table: tbl, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter})
	conn.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}})
	if err := conn.Flush(); err != nil {
		unix.Close(fd)
		t.Fatalf("nftables in %s: %v", ns, err)
	}
	done := false
	undo = func() {
		if done {
			return
		}
		done = true
		conn.DelTable(tbl)
		if err := conn.Flush(); err != nil {
			t.Errorf("remove the drop rule in %s: %v", ns, err)
		}
		unix.Close(fd)
	}
	t.Cleanup(undo)
	return undo
}
