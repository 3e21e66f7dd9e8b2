package testenv

import (
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestReapProcesses: a process whose command line names a test's
// directory (as runsc's do, their --root and bundle under it) is killed
// and reaped by ReapProcesses, and said so; others are left alone.
func TestReapProcesses(t *testing.T) {
	dir := t.TempDir()
	// A sleep whose argv[0] names the directory.
	left := exec.Command("bash", "-c", `exec -a "$0" sleep 1000`, dir+"/runsc")
	other := exec.Command("bash", "-c", `exec -a "$0" sleep 1000`, dir+"-other/runsc")
	for _, c := range []*exec.Cmd{left, other} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	}
	// Reaped by its parent (this test) once killed, as runsc's are by
	// init or the daemon.
	done := make(chan error, 1)
	go func() { done <- left.Wait() }()
	// Once bash has exec'd sleep under that name: bash's own command line
	// names the directory too (as its last argument), and a process caught
	// mid-exec shows no command line at all, so wait for argv[0].
	execd := func() bool {
		for _, p := range ProcessesMentioning(dir + "/runsc\x00") {
			if _, cmd, _ := strings.Cut(p, " "); strings.HasPrefix(cmd, dir+"/runsc 1000") {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(10 * time.Second); !execd(); {
		if time.Now().After(deadline) {
			t.Fatal("the process never showed under its name")
		}
		time.Sleep(time.Millisecond) // polling /proc for the exec
	}
	killed := ReapProcesses(dir + "/")
	if len(killed) != 1 || !strings.Contains(killed[0], dir) {
		t.Fatalf("killed %q, want the one process naming %s", killed, dir)
	}
	if err := <-done; err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("the process naming the directory ended with %v, want killed", err)
	}
	if got := ProcessesMentioning(dir + "-other"); len(got) != 1 {
		t.Fatalf("the process naming another directory: %q, want it left running", got)
	}
}

// TestNetShareHeldThroughLaterCleanups: a network share is held through
// the cleanups registered after ReserveNet (they run first) and released
// before those registered before it: a test whose cleanup removes the
// share's leftovers takes the share before registering it.
func TestNetShareHeldThroughLaterCleanups(t *testing.T) {
	var before, after bool
	var plan NetPlan
	t.Run("share", func(t *testing.T) {
		t.Cleanup(func() { before = plan.Held() })
		plan = ReserveNet(t)
		t.Cleanup(func() { after = plan.Held() })
		if !plan.Held() {
			t.Fatal("a share just taken is not held")
		}
	})
	if !after || before || plan.Held() {
		t.Fatalf("held in a cleanup registered after ReserveNet: %v (want true), before it: %v (want false), after the test: %v (want false)", after, before, plan.Held())
	}
	if (NetPlan{}).Held() {
		t.Fatal("no share is held")
	}
}
