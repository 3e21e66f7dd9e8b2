package main_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

func TestCompletion(t *testing.T) {
	d := testenv.StartDaemon(t)
	ctx := t.Context()
	sb, err := d.Client.CreateSandbox(ctx, sdk.CreateSandboxRequest{Name: "comp-box"})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := d.Client.SnapshotSandbox(ctx, sb.ID, "comp-snap")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		words []string
		want  []string // exactly, in order, when exact; else contained
		exact bool
	}{
		{[]string{""}, []string{"create", "exec", "mcp", "stats", "tui"}, false},
		{[]string{"sl"}, []string{"sleep"}, true},
		{[]string{"rm", ""}, []string{"comp-box", sb.ID}, true},
		{[]string{"exec", "comp"}, []string{"comp-box"}, true},
		{[]string{"exec", "comp-box", "--", ""}, nil, true},
		{[]string{"--host", d.Socket, "stats", sb.ID[:4]}, []string{sb.ID}, true},
		{[]string{"fork", ""}, []string{"comp-snap", snap.ID, "comp-box", sb.ID}, true},
		{[]string{"snapshot", "rm", ""}, []string{"comp-snap", snap.ID}, true},
		{[]string{"snapshot", ""}, []string{"ls", "rm", "comp-box", sb.ID}, true},
		{[]string{"create", "--from", "c"}, []string{"comp-snap"}, true},
		{[]string{"create", "--image", "def"}, []string{"default"}, true},
		{[]string{"image", "rm", ""}, []string{"default"}, false},
		{[]string{"completion", ""}, []string{"bash", "zsh", "fish"}, true},
		{[]string{"rm", "-"}, nil, true},
	} {
		out, errs, code := cli(t, d, "", append([]string{"__complete"}, tc.words...)...)
		got := strings.Fields(out)
		ok := code == 0 && slices.Equal(got, tc.want)
		if !tc.exact {
			ok = code == 0
			for _, w := range tc.want {
				ok = ok && slices.Contains(got, w)
			}
		}
		if !ok {
			t.Errorf("__complete %q = %q (%q, %d), want %q", tc.words, got, errs, code, tc.want)
		}
	}

	// The bash script, sourced in a real bash, asks the binary.
	script, errs, code := cli(t, d, "", "completion", "bash")
	if code != 0 {
		t.Fatalf("completion bash: %q %d", errs, code)
	}
	dir := testenv.TempDir(t)
	if err := os.Symlink(d.Bin, filepath.Join(dir, "clade")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "clade.bash"), []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "--norc", "-c", `source "$1"; COMP_WORDS=(clade rm comp); COMP_CWORD=2; _clade_complete; printf '%s\n' "${COMPREPLY[@]}"`, "bash", filepath.Join(dir, "clade.bash"))
	cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"), "CLADE_HOST="+d.Socket)
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "comp-box" {
		t.Fatalf("bash completion of `clade rm comp`: %q, %v", out, err)
	}
	// zsh and fish when installed: zsh's compadd is stubbed to print what
	// it is given, fish completes a command line itself.
	for _, tc := range []struct{ shell, run string }{
		{"zsh", `compadd() { shift 2; print -l -- "$@"; }; _files() {}; source "$1"; words=(clade rm comp); CURRENT=3; _clade`},
		{"fish", `source $argv[1]; complete -C "clade rm comp"`},
	} {
		script, errs, code := cli(t, d, "", "completion", tc.shell)
		if code != 0 {
			t.Fatalf("completion %s: %q %d", tc.shell, errs, code)
		}
		if _, err := exec.LookPath(tc.shell); err != nil {
			t.Logf("%s not installed: only its script's generation is tested", tc.shell)
			continue
		}
		path := filepath.Join(dir, "clade."+tc.shell)
		if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
			t.Fatal(err)
		}
		args := []string{"-c", tc.run, tc.shell, path}
		if tc.shell == "fish" {
			args = []string{"-c", tc.run, path}
		}
		cmd := exec.Command(tc.shell, args...)
		cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"), "CLADE_HOST="+d.Socket)
		out, err := cmd.CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "comp-box" {
			t.Errorf("%s completion of `clade rm comp`: %q, %v", tc.shell, out, err)
		}
	}
	if _, errs, code := cli(t, d, "", "completion", "tcsh"); code != 2 || !strings.Contains(errs, "unknown shell") {
		t.Errorf("completion tcsh: %q %d", errs, code)
	}
}
