package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/sdk"
)

// verbs are what `clade <TAB>` offers.
var verbs = []string{"bench", "completion", "cp", "create", "daemon", "exec", "fork", "help", "image", "inspect", "ls",
	"mcp", "network", "port-forward", "rm", "sleep", "snapshot", "stats", "timeout", "tui", "version", "wake"}

// sandboxVerbs take sandbox ids or names as arguments.
var sandboxVerbs = []string{"exec", "inspect", "rm", "remove", "sleep", "wake", "timeout", "port-forward", "network", "stats"}

const completionUsage = `Usage: clade completion bash|zsh|fish

Prints a completion script: verbs, sandbox ids and names, snapshot and
image names (asked of the daemon as you type). Load it with:
  bash:  source <(clade completion bash)    (or save it in /etc/bash_completion.d/clade)
  zsh:   source <(clade completion zsh)     (after compinit)
  fish:  clade completion fish | source     (or save it in ~/.config/fish/completions/clade.fish)
`

func cmdCompletion(args []string) error {
	if len(args) != 1 {
		fmt.Fprint(os.Stderr, completionUsage)
		return errUsage
	}
	switch args[0] {
	case "bash":
		fmt.Print(bashCompletion)
	case "zsh":
		fmt.Print(zshCompletion)
	case "fish":
		fmt.Print(fishCompletion)
	case "-h", "--help", "help":
		fmt.Print(completionUsage)
	default:
		fmt.Fprintf(os.Stderr, "clade completion: unknown shell %q\n\n%s", args[0], completionUsage)
		return errUsage
	}
	return nil
}

// The scripts hand the words typed so far (after `clade`, the one under
// the cursor last, maybe empty) to `clade __complete`, which prints one
// candidate a line; with none the shell completes file names.
const bashCompletion = `# bash completion for clade
_clade_complete() {
	local IFS=$'\n'
	COMPREPLY=($(clade __complete "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null))
}
complete -o default -o nosort -F _clade_complete clade
`

const zshCompletion = `#compdef clade
# zsh completion for clade
_clade() {
	local -a cands
	cands=("${(@f)$(clade __complete "${(@)words[2,CURRENT]}" 2>/dev/null)}")
	cands=(${cands:#})
	if (( ${#cands} )); then
		compadd -Q -- $cands
	else
		_files
	fi
}
if (( $+functions[compdef] )); then compdef _clade clade; fi
`

const fishCompletion = `# fish completion for clade
function __clade_complete
	set -l toks (commandline -opc)
	clade __complete $toks[2..-1] (commandline -ct) 2>/dev/null
end
complete -c clade -f -a '(__clade_complete)'
`

// cmdComplete answers the completion scripts. A daemon that cannot be
// reached just gives no candidates from it.
func cmdComplete(ctx context.Context, host string, words []string) error {
	if len(words) == 0 {
		words = []string{""}
	}
	// The scripts give global flags too; they may name the daemon.
	for len(words) > 1 {
		if words[0] == "--host" && len(words) > 2 {
			host, words = words[1], words[2:]
			continue
		}
		if h, ok := strings.CutPrefix(words[0], "--host="); ok {
			host, words = h, words[1:]
			continue
		}
		break
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c, err := sdk.New(host)
	if err != nil {
		return nil
	}
	for _, cand := range completions(ctx, c, words) {
		fmt.Println(cand)
	}
	return nil
}

// completions returns the candidates for the last of words, the word
// being typed.
func completions(ctx context.Context, c *sdk.Client, words []string) []string {
	cur := words[len(words)-1]
	prev := ""
	if len(words) > 1 {
		prev = words[len(words)-2]
	}
	pos := len(words) - 1 // index of cur; 0 is the verb
	var cands []string
	switch verb := words[0]; {
	case pos == 0:
		cands = verbs
	case strings.HasPrefix(cur, "-"):
		return nil // flags: each verb's --help lists them
	case prev == "--image" || (verb == "image" && prev == "--from"):
		cands = imageNames(ctx, c)
	case verb == "create" && prev == "--from":
		cands = snapshotNames(ctx, c)
	case verb == "completion" && pos == 1:
		cands = []string{"bash", "zsh", "fish"}
	case slices.Contains(sandboxVerbs, verb):
		if verb == "exec" && slices.Contains(words[1:pos], "--") {
			return nil // the command in the sandbox
		}
		cands = sandboxNames(ctx, c)
	case verb == "fork":
		cands = append(snapshotNames(ctx, c), sandboxNames(ctx, c)...)
	case verb == "snapshot" || verb == "snapshots":
		switch {
		case pos == 1:
			cands = append([]string{"ls", "rm"}, sandboxNames(ctx, c)...)
		case words[1] == "rm" || words[1] == "remove":
			cands = snapshotNames(ctx, c)
		}
	case verb == "image" || verb == "images":
		switch {
		case pos == 1:
			cands = []string{"ls", "inspect", "rm", "pull", "import", "build"}
		case words[1] == "rm" || words[1] == "remove" || words[1] == "inspect":
			cands = imageNames(ctx, c)
		}
	case verb == "cp":
		for _, s := range sandboxNames(ctx, c) {
			cands = append(cands, s+":")
		}
	}
	var out []string
	for _, s := range cands {
		if strings.HasPrefix(s, cur) && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

func sandboxNames(ctx context.Context, c *sdk.Client) []string {
	sbs, _ := c.ListSandboxes(ctx)
	var out []string
	for _, s := range sbs {
		if s.Name != "" {
			out = append(out, s.Name)
		}
		out = append(out, s.ID)
	}
	return out
}

func snapshotNames(ctx context.Context, c *sdk.Client) []string {
	snaps, _ := c.ListSnapshots(ctx)
	var out []string
	for _, s := range snaps {
		if s.Name != "" {
			out = append(out, s.Name)
		}
		out = append(out, s.ID)
	}
	return out
}

func imageNames(ctx context.Context, c *sdk.Client) []string {
	imgs, _ := c.ListImages(ctx)
	var out []string
	for _, i := range imgs {
		out = append(out, i.Name)
		if i.Ref != "" {
			out = append(out, i.Ref)
		}
	}
	return out
}
