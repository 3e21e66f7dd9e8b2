package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/atrest"

	"github.com/spf13/cobra"
)

func TestNormalizeArgs(t *testing.T) {
	for _, tc := range []struct {
		in, want []string
	}{
		{[]string{"ls", "-json"}, []string{"ls", "--json"}},
		{[]string{"-host", "/s", "ls", "-label=a=b"}, []string{"--host", "/s", "ls", "--label=a=b"}},
		{[]string{"-host=/s", "images", "ls", "-json"}, []string{"--host=/s", "images", "ls", "--json"}},
		{[]string{"rm", "-f", "x"}, []string{"rm", "-f", "x"}},
		{[]string{"fork", "x", "-n", "3", "-json"}, []string{"fork", "x", "-n", "3", "--json"}},
		// Flags that take a value keep it as it is.
		{[]string{"create", "-name", "-json"}, []string{"create", "--name", "-json"}},
		{[]string{"exec", "--timeout", "-5s", "-it", "ID"}, []string{"exec", "--timeout", "-5s", "-it", "ID"}},
		// exec: after the sandbox and after -- everything is the command's.
		{[]string{"exec", "-it", "-workdir", "/tmp", "ID", "ls", "-json"}, []string{"exec", "-it", "--workdir", "/tmp", "ID", "ls", "-json"}},
		{[]string{"exec", "ID", "--", "ls", "-env"}, []string{"exec", "ID", "--", "ls", "-env"}},
		{[]string{"snapshot", "ID", "-name", "n"}, []string{"snapshot", "ID", "--name", "n"}},
		{[]string{"ls", "-help"}, []string{"ls", "--help"}},
		{[]string{"-version"}, []string{"--version"}},
		// Unknown ones are left for cobra to refuse.
		{[]string{"ls", "-bogus"}, []string{"ls", "-bogus"}},
		{[]string{"__complete", "ls", "-js"}, []string{"__complete", "ls", "-js"}},
	} {
		if got := normalizeArgs(newRoot(), tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("normalizeArgs(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestEveryVerbHelps: every verb and sub-verb has a summary, an example
// and a --help that exits 0.
func TestEveryVerbHelps(t *testing.T) {
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = null
	t.Cleanup(func() { os.Stdout = stdout; null.Close() })
	var walk func(c *cobra.Command)
	n := 0
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if sub.Hidden || sub.Name() == "help" {
				continue
			}
			n++
			if sub.Short == "" || strings.HasSuffix(sub.Short, ".") {
				t.Errorf("%s: summary %q: want one line without a full stop", sub.CommandPath(), sub.Short)
			}
			if sub.Example == "" {
				t.Errorf("%s: no example in its --help", sub.CommandPath())
			}
			if sub.Runnable() && sub.Args == nil {
				t.Errorf("%s: no check of its arguments", sub.CommandPath())
			}
			args := append(strings.Fields(sub.CommandPath())[1:], "--help")
			if code := run(args); code != 0 {
				t.Errorf("clade %s: exit %d", strings.Join(args, " "), code)
			}
			walk(sub)
		}
	}
	walk(newRoot())
	if n < 35 {
		t.Errorf("only %d verbs found", n)
	}
}

// TestBadValuesAreUsageErrors: an argument or flag value a verb cannot
// use exits 2 like a flag cobra cannot parse, before any daemon is asked
// (there is none here).
func TestBadValuesAreUsageErrors(t *testing.T) {
	host := t.TempDir() + "/no-daemon.sock"
	for _, args := range [][]string{
		{"events", "--label", "novalue"},
		{"ls", "--label", "novalue"},
		{"ls", "--label", "=x"},
		{"ls", "--json", "-q"},
		{"sleep", "--label", "novalue"},
		{"create", "--env", "NOEQUALS"},
		{"create", "--on-timeout", "explode"},
		{"timeout", "box", "1h", "--on-timeout", "explode"},
		{"exec", "--env", "=x", "box", "--", "true"},
		{"exec", "--timeout", "-1s", "box", "--", "true"},
		{"events", "--since", "abc"},
		{"events", "--since", "n1:x"},
		{"events", "--since", "n1:5,n1:6"},
		{"events", "--cluster=false", "--since", "n1:5"}, // positions are a merged stream's
		{"create", "--label", "=x"},
		{"cp", "a", "b"},
		{"cp", "x:/a", "y:/b"},
		{"timeout", "box", "soon"},
		{"url", "box", "http"},
		{"port-forward", "box", "0"},
		{"mcp", "--log-level", "loud"},
		{"mcp", "--token-file", "/dev/null"},
		{"exec", "box", "--env", "X=1", "--", "env"}, // a flag after the sandbox
		{"exec", "box", "-it", "bash"},
		{"fork", "box", "-n", "0"},
		{"tui", "--interval", "1ms"},

		{"url", "box", "8000", "--ttl", "1ns"}, // would round to 0 ms: an hour
		{"url", "box", "8000", "--ttl", "-5m"},
		{"url", "box", "8000", "--ttl", "721h"},
		{"create", "--disk", "abc"},
		{"create", "--disk", "0"},
		{"create", "--timeout", "-1s"},
		{"volume", "create", "v", "--size", "lots"},
	} {
		if code := run(append([]string{"--host", host}, args...)); code != 2 {
			t.Errorf("clade %s: exit %d, want 2", strings.Join(args, " "), code)
		}
	}
}

// TestGoodValuesReachTheDaemon: what TestBadValuesAreUsageErrors refuses
// has a valid neighbour that gets past the checks to the (missing) daemon:
// exit 1, not 2.
func TestGoodValuesReachTheDaemon(t *testing.T) {
	host := t.TempDir() + "/no-daemon.sock"
	for _, args := range [][]string{
		{"exec", "box", "--", "--env"}, // -- makes it the command
		{"exec", "--env", "X=1", "box", "--", "env"},
		{"fork", "box", "-n", "1"},
		{"url", "box", "8000", "--ttl", "1ms"},
		{"url", "box", "8000", "--ttl", "720h"},
		{"create", "--disk", "1TiB"},
		{"ls", "--label", "a=b", "-q"},
		{"sleep", "--label", "a="},
		{"create", "--env", "X=", "--on-timeout", "sleep"},
		{"timeout", "box", "1h", "--on-timeout", "rm"},
		{"exec", "--env", "X==", "--timeout", "0s", "box", "--", "true"},
		{"events", "--since", "5"},
		{"events", "--since", "n1:5,n2:6"},
	} {
		if code := run(append([]string{"--host", host}, args...)); code != 1 {
			t.Errorf("clade %s: exit %d, want 1 (no daemon)", strings.Join(args, " "), code)
		}
	}
}

// TestBadDaemonNumbersAreUsageErrors: the daemon refuses numbers out of
// range before it takes a lock, a socket or a network (-2 restores at once
// used to panic the start; a negative ratio or floor turned its guard off).
func TestBadDaemonNumbersAreUsageErrors(t *testing.T) {
	dir := t.TempDir()
	// Were a check missing, the daemon would stop at the missing runsc,
	// in a scratch data dir, not serve.
	safe := []string{"daemon", "--data-dir", dir + "/data", "--socket", dir + "/s.sock", "--runsc", dir + "/no-runsc",
		"--build-default-image=false", "--network-prefix", "cbad", "--network-range", "10.251.0.0/24"}
	for _, args := range [][]string{
		{"--restore-parallel", "-2"},
		{"--warm-pool", "-1"},
		{"--hot-pool", "-1"},
		{"--network-pool", "-1"},
		{"--max-fork", "0"},
		{"--memory-overcommit", "-1"},
		{"--memory-overcommit", "NaN"}, // was the cap off, silently
		{"--memory-overcommit", "inf"}, // was every create refused (int(+Inf) is negative)
		{"--memory-overcommit", "1e300"},
		{"--pressure-floor", "-2"},
		{"--memory-floor", "-5"},
		{"--disk-floor", "-1"},
		{"--default-disk", "-5"},
		{"--default-memory", "1"},
		{"--max-memory", "-1"},
		{"--max-memory", "1"},
		{"--max-memory", "256"}, // below the 512 MiB a sandbox that asks for none gets
		{"--max-cpus", "-1"},
		{"--max-cpus", "NaN"},
		{"--max-cpus", "0.5"}, // below the 1 CPU a sandbox that asks for none gets
		{"--qemu-tcg-cache", "0"},
		{"--qemu-tcg-cache", "4096"},
		{"--code-answer-timeout", "0"}, // no bound: refused, not taken for the default
		{"--code-answer-timeout", "-1s"},
		{"--log-level", "loud"},
	} {
		if code := run(append(slices.Clone(safe), args...)); code != 2 {
			t.Errorf("clade daemon %s: exit %d, want 2", strings.Join(args, " "), code)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("a refused daemon start left %v in its dirs", ents)
	}
}

// TestEncryptAtRestRefusesDirectoryStore: --encrypt-at-rest with a
// directory --object-store is refused at start: only an S3 store's objects
// are sealed in the daemon, and a directory store (another disk, a shared
// mount) got every sleep image, sandbox memory included, in plaintext,
// from a daemon told to keep its state encrypted at rest.
func TestEncryptAtRestRefusesDirectoryStore(t *testing.T) {
	dir := t.TempDir()
	safe := []string{"daemon", "--data-dir", dir + "/data", "--socket", dir + "/s.sock", "--runsc", dir + "/no-runsc",
		"--build-default-image=false", "--network-prefix", "cbad", "--network-range", "10.251.0.0/24", "--encrypt-at-rest"}
	for _, store := range []string{dir + "/store", "file://" + dir + "/store"} {
		if code := run(append(slices.Clone(safe), "--object-store", store)); code != 2 {
			t.Errorf("clade daemon --encrypt-at-rest --object-store %s: exit %d, want 2", store, code)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("a refused daemon start left %v in its dirs", ents)
	}
}

// TestFailedEncryptedStartUnmounts: a daemon with --encrypt-at-rest whose
// start fails after it mounted the encrypted view (here: no runsc) leaves
// no mount behind: before, the view and its gocryptfs stayed, until the
// host rebooted or an operator unmounted it. (A view the previous daemon
// left mounted for its running sandboxes is still kept.)
func TestFailedEncryptedStartUnmounts(t *testing.T) {
	if _, err := exec.LookPath("gocryptfs"); err != nil {
		t.Skip("no gocryptfs")
	}
	dir := t.TempDir()
	plain := filepath.Join(dir, "data", "plain")
	t.Cleanup(func() {
		if atrest.Mounted(plain) {
			_ = atrest.UnmountDir(plain)
		}
	})
	args := []string{"daemon", "--data-dir", dir + "/data", "--socket", dir + "/s.sock", "--runsc", dir + "/no-runsc",
		"--build-default-image=false", "--network-prefix", "cbad", "--network-range", "10.251.0.0/24", "--encrypt-at-rest"}
	if code := run(args); code == 0 {
		t.Fatal("the daemon started without runsc")
	}
	if atrest.Mounted(plain) {
		t.Errorf("a failed start left the encrypted view %s mounted", plain)
	}
}
