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
	t.Parallel() // a daemon of its own: see TestMain
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
	vol, err := d.Client.CreateVolume(ctx, sdk.CreateVolumeRequest{Name: "comp-vol", SizeBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Client.SetSecret(ctx, "comp-secret", []byte("x")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = d.Client.DeleteSecret(t.Context(), "comp-secret")
		_ = d.Client.DeleteVolume(t.Context(), vol.Name)
	})
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
		{[]string{"exec", "comp-box", ""}, nil, true},
		{[]string{"--host", d.Socket, "stats", sb.ID[:4]}, []string{sb.ID}, true},
		{[]string{"fork", ""}, []string{"comp-snap", snap.ID, "comp-box", sb.ID}, true},
		{[]string{"snapshot", "rm", ""}, []string{"comp-snap", snap.ID}, true},
		{[]string{"snapshot", ""}, []string{"ls", "rm", "comp-box", sb.ID}, false},
		{[]string{"create", "--from", "comp-"}, []string{"comp-snap"}, true},
		{[]string{"create", "--image", "def"}, []string{"default"}, true},
		{[]string{"create", "--network", ""}, []string{"internet", "none"}, true},
		{[]string{"create", "--volume", "comp"}, []string{"comp-vol:/"}, true},
		{[]string{"create", "--secret", ""}, []string{"comp-secret"}, true},
		{[]string{"create", "--me"}, []string{"--memory"}, true},
		{[]string{"image", "rm", ""}, []string{"default"}, false},
		{[]string{"images", ""}, []string{"ls", "pull", "build", "import", "inspect", "rm"}, false},
		{[]string{"image", "build", "x", "--from", "def"}, []string{"default"}, true},
		{[]string{"volume", "rm", ""}, []string{"comp-vol"}, true},
		{[]string{"secret", "rm", "comp"}, []string{"comp-secret"}, true},
		{[]string{"events", "--sandbox", "comp"}, []string{"comp-box"}, true},
		{[]string{"cp", "comp"}, []string{"comp-box:"}, true},
		{[]string{"completion", ""}, []string{"bash", "zsh", "fish"}, true},
		{[]string{"rm", "--"}, []string{"--force", "--help", "--host"}, false},
	} {
		got, errs, code := complete(t, d, tc.words...)
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

	// A daemon that is not there: verbs and flags still complete, names
	// give nothing, and quickly.
	down := filepath.Join(testenv.TempDir(t), "down.sock")
	if got, _, code := complete(t, d, "--host", down, "rm", ""); code != 0 || len(got) != 0 {
		t.Errorf("rm with the daemon down: %q %d", got, code)
	}
	if got, _, code := complete(t, d, "--host", down, "wa"); code != 0 || !slices.Equal(got, []string{"wake"}) {
		t.Errorf("verbs with the daemon down: %q %d", got, code)
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
	// The script needs the bash-completion package, as every distribution's
	// bash has it; a real bash completes a real command line with it.
	const bashCompletion = "/usr/share/bash-completion/bash_completion"
	if _, err := os.Stat(bashCompletion); err != nil {
		t.Logf("%s not installed: the bash script is not run", bashCompletion)
	} else {
		for _, tc := range []struct{ line, want string }{
			{"clade rm comp", "comp-box"},
			{"clade snapshot rm comp-s", "comp-snap"},
			{"clade create --image def", "default"},
			{"clade vol", "volume"},
			{"clade volume inspect comp", "comp-vol"},
		} {
			run := `source "$1"; source "$2"; COMP_LINE="$3"; COMP_POINT=${#COMP_LINE}; read -ra COMP_WORDS <<<"$COMP_LINE"; ` +
				`[[ $COMP_LINE == *" " ]] && COMP_WORDS+=(""); COMP_CWORD=$((${#COMP_WORDS[@]}-1)); __start_clade clade; printf '%s\n' "${COMPREPLY[@]}"`
			cmd := exec.Command("bash", "--norc", "-c", run, "bash", bashCompletion, filepath.Join(dir, "clade.bash"), tc.line)
			cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"), "CLADE_HOST="+d.Socket)
			// stderr has bash's note that compopt works only in a
			// completion bash runs itself, as below.
			out, err := cmd.Output()
			if err != nil || strings.TrimSpace(string(out)) != tc.want {
				t.Errorf("bash completion of %q: %q, %v; want %q", tc.line, out, err, tc.want)
			}
		}
		// And as a person does it: Tab in an interactive bash.
		tm := startTmux(t, "env", "PATH="+dir+":"+os.Getenv("PATH"), "CLADE_HOST="+d.Socket, "PS1=$ ", "bash", "--norc", "--noprofile")
		tm.keys("source "+bashCompletion+"; source "+filepath.Join(dir, "clade.bash")+"; clear", "Enter")
		tm.keys("clade volume insp", "Tab")
		tm.waitFor(`(?m)^\$ clade volume inspect\s*$`)
		tm.keys("comp", "Tab")
		tm.waitFor(`(?m)^\$ clade volume inspect comp-vol\s*$`)
		tm.keys("C-u", "clade ex", "Tab", "comp", "Tab", "--", "Enter")
		tm.waitFor(`(?m)^\$ clade exec comp-box --\s*$`)
	}
	// zsh's script is cobra's; only that it is one is checked. fish, when
	// installed, completes a command line itself.
	if script, errs, code := cli(t, d, "", "completion", "zsh"); code != 0 || !strings.HasPrefix(script, "#compdef clade") {
		t.Errorf("completion zsh: %q %q %d", script[:min(len(script), 80)], errs, code)
	}
	script, errs, code = cli(t, d, "", "completion", "fish")
	if code != 0 {
		t.Fatalf("completion fish: %q %d", errs, code)
	}
	if _, err := exec.LookPath("fish"); err != nil {
		t.Logf("fish not installed: only its script's generation is tested")
	} else {
		path := filepath.Join(dir, "clade.fish")
		if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("fish", "-c", `source $argv[1]; complete -C "clade rm comp"`, path)
		cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"), "CLADE_HOST="+d.Socket)
		out, err := cmd.CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "comp-box" {
			t.Errorf("fish completion of `clade rm comp`: %q, %v", out, err)
		}
	}
	if _, errs, code := cli(t, d, "", "completion", "tcsh"); code != 2 || !strings.Contains(errs, "unknown shell") {
		t.Errorf("completion tcsh: %q %d", errs, code)
	}
}

// complete asks the binary for the candidates after words, as the
// completion scripts do, and returns them without cobra's directive line.
func complete(t *testing.T, d *testenv.Daemon, words ...string) ([]string, string, int) {
	t.Helper()
	out, errs, code := cli(t, d, "", append([]string{"__completeNoDesc"}, words...)...)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) == 0 || !strings.HasPrefix(lines[len(lines)-1], ":") {
		t.Fatalf("__complete %q: no directive in %q (%q)", words, out, errs)
	}
	var got []string
	for _, l := range lines[:len(lines)-1] {
		if l != "" {
			got = append(got, l)
		}
	}
	return got, errs, code
}
