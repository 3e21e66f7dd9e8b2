package network_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Cleanup() // the binaries testenv built
	os.Exit(code)
}

// probeSh starts, in the background, a loop that tries to connect to
// argv[1]:80 every few ms, counting tries in /tmp/tries and successes in
// /tmp/hits.
const probeSh = `python3 -c '
import socket, sys, time
a = sys.argv[1]
while True:
    try:
        s = socket.create_connection((a, 80), timeout=0.2)
        s.close()
        open("/tmp/hits", "a").write("x")
    except OSError:
        pass
    open("/tmp/tries", "a").write(".")
    time.sleep(0.005)
' "$0" >/dev/null 2>&1 &`

func probeCounts(t *testing.T, c *sdk.Client, id string) (tries, hits int) {
	t.Helper()
	out := execOut(t, c, id, "sh", "-c", "cat /tmp/tries 2>/dev/null | wc -c; cat /tmp/hits 2>/dev/null | wc -c")
	f := strings.Fields(out)
	tries, _ = strconv.Atoi(f[0])
	hits, _ = strconv.Atoi(f[1])
	return tries, hits
}

// waitTries waits until the probe in id has tried more than n times.
func waitTries(t *testing.T, c *sdk.Client, id string, n int) (tries, hits int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		tries, hits = probeCounts(t, c, id)
		if tries > n {
			return tries, hits
		}
		if time.Now().After(deadline) {
			t.Fatalf("the probe in %s does not run: %d tries", id, tries)
		}
	}
}

// TestDaemonNetworkDenyNeverOpens: a deny sandbox claimed hot, with a probe loop
// running from its first exec, never reaches the test host: not claimed,
// not in fork children (restored into default-policy prepared
// sandboxes), not woken into the warm pool, not across a daemon killed
// mid-wake.
func TestDaemonNetworkDenyNeverOpens(t *testing.T) {
	hp := testenv.ReserveNet(t)
	host := testenv.StartTestHost(t, hp)
	d := testenv.StartDaemon(t, "--dns-upstream", host.DNS, "--hot-pool", "2", "--warm-pool", "3")
	c := d.Client
	deadline := time.Now().Add(time.Minute)
	for {
		h, err := c.Health(t.Context())
		if err == nil && h.Hot == 2 && h.Warm >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pools did not fill: %+v %v", h, err)
		}
		time.Sleep(20 * time.Millisecond) // polling the pools' background refill
	}
	deny, err := c.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Network: &sdk.Network{Egress: "deny"}})
	if err != nil {
		t.Fatal(err)
	}
	list, err := c.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Network: &sdk.Network{Allow: []string{host.Addr2.String() + "/32"}}})
	if err != nil {
		t.Fatal(err)
	}
	execOut(t, c, deny.ID, "sh", "-c", probeSh, host.Addr.String())
	execOut(t, c, list.ID, "sh", "-c", probeSh, host.Addr.String())
	for _, id := range []string{deny.ID, list.ID} {
		if tries, hits := waitTries(t, c, id, 20); hits != 0 {
			t.Fatalf("claimed %s reached the host: %d of %d", id, hits, tries)
		}
	}
	res, err := c.Fork(t.Context(), deny.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range res.Children {
		if ch.Error != "" {
			t.Fatal(ch.Error)
		}
		execOut(t, c, ch.ID, "sh", "-c", "rm -f /tmp/hits; : >/tmp/tries")
		if tries, hits := waitTries(t, c, ch.ID, 20); hits != 0 {
			t.Fatalf("fork child %s reached the host: %d of %d", ch.ID, hits, tries)
		}
	}
	for _, id := range []string{deny.ID, list.ID} {
		if _, err := c.Sleep(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Wake(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		tries, _ := probeCounts(t, c, id)
		if tries, hits := waitTries(t, c, id, tries+20); hits != 0 {
			t.Fatalf("woken %s reached the host: %d of %d", id, hits, tries)
		}
	}
	// A daemon killed mid-wake, then restarted: reconcile settles it asleep
	// or running, and the probe still never gets through.
	if _, err := c.Sleep(t.Context(), deny.ID); err != nil {
		t.Fatal(err)
	}
	d.Kill()
	d.Start([]string{"CLADE_CRASH_AT=wake-before-engine"})
	if _, err := c.Wake(t.Context(), deny.ID); err == nil {
		t.Fatal("the wake succeeded; the daemon should have crashed in it")
	}
	_ = d.Wait()
	d.Start(nil)
	tries, _ := probeCounts(t, c, deny.ID) // wakes it if still asleep
	if tries, hits := waitTries(t, c, deny.ID, tries+20); hits != 0 {
		t.Fatalf("%s after a kill mid-wake reached the host: %d of %d", deny.ID, hits, tries)
	}
	if tries, hits := waitTries(t, c, list.ID, 0); hits != 0 {
		t.Fatalf("%s after restart reached the host: %d of %d", list.ID, hits, tries)
	}
	// Killed right after a claim returned: the restarted daemon keeps the
	// sandbox's deny (its slot's rules are rebuilt closed, then its own).
	deadline = time.Now().Add(time.Minute)
	for {
		h, err := c.Health(t.Context())
		if err == nil && h.Hot == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the hot pool did not refill: %+v %v", h, err)
		}
		time.Sleep(20 * time.Millisecond) // polling the pool's background refill
	}
	late, err := c.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Network: &sdk.Network{Egress: "deny"}})
	if err != nil {
		t.Fatal(err)
	}
	execOut(t, c, late.ID, "sh", "-c", probeSh, host.Addr.String())
	d.Kill()
	d.Start(nil)
	if tries, hits := waitTries(t, c, late.ID, 20); hits != 0 {
		t.Fatalf("%s claimed before a kill reached the host: %d of %d", late.ID, hits, tries)
	}
}

// TestDaemonHostnameEnv: the first exec in a sandbox sees its own
// hostname both ways (uname and $HOSTNAME), whether it was claimed hot
// with a name, taken from the warm pool with one, or forked.
func TestDaemonHostnameEnv(t *testing.T) {
	d := testenv.StartDaemon(t, "--hot-pool", "1", "--warm-pool", "1")
	c := d.Client
	deadline := time.Now().Add(time.Minute)
	for {
		h, err := c.Health(t.Context())
		if err == nil && h.Hot == 1 && h.Warm >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pools did not fill: %+v %v", h, err)
		}
		time.Sleep(20 * time.Millisecond) // polling the pools' background refill
	}
	hot, err := c.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Name: "hot-named"})
	if err != nil {
		t.Fatal(err)
	}
	// At once, before the pool refills: the warm pool's prepared sandbox.
	warm, err := c.CreateSandbox(t.Context(), sdk.CreateSandboxRequest{Name: "warm-named"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Fork(t.Context(), hot.ID, 1)
	if err != nil || res.Children[0].Error != "" {
		t.Fatal(err, res)
	}
	child := res.Children[0].ID
	for id, want := range map[string]string{hot.ID: "hot-named", warm.ID: "warm-named", child: "sb-" + child[:8]} {
		if got := execOut(t, c, id, "sh", "-c", `echo "$(hostname) $HOSTNAME"`); got != want+" "+want {
			t.Errorf("sandbox %s: hostname and $HOSTNAME %q, want %q twice", id, got, want)
		}
	}
}

// TestDaemonStopDuringHotStart: a daemon stopped (SIGTERM) while its hot
// pool starts a sandbox (the sandbox's slot is held, the pool still empty)
// waits for that start and gives everything back: no slot, no nftables
// table, no runsc process is left for the next start to find.
func TestDaemonStopDuringHotStart(t *testing.T) {
	d := testenv.StartDaemon(t, "--hot-pool", "1")
	deadline := time.Now().Add(time.Minute)
	for {
		slots, _ := os.ReadDir(filepath.Join(d.DataDir, "network"))
		h, err := d.Client.Health(t.Context())
		if err == nil && h.Hot == 0 && len(slots) > 0 {
			break // a hot start under way: its slot is acquired
		}
		if err == nil && h.Hot > 0 {
			t.Skip("the hot pool filled before a start under way was seen")
		}
		if time.Now().After(deadline) {
			t.Fatalf("no hot start seen: %+v %v", h, err)
		}
		time.Sleep(time.Millisecond) // polling for the start's slot
	}
	d.Stop()
	if left := append(testenv.Leaks(d.DataDir), d.Net.NetLeaks()...); len(left) > 0 {
		t.Fatalf("left after a stop during a hot start:\n  %s\n%s", strings.Join(left, "\n  "), d.Log())
	}
}
