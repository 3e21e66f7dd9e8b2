// Command clade is the clade sandbox runtime: `clade daemon` serves the API,
// every other verb is a client of it through the Go SDK.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/clade-sandbox/clade/sdk"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func versionString() string {
	v := version
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v += "+" + s.Value[:12]
			}
		}
	}
	return v
}

const usage = `clade runs untrusted code in gVisor sandboxes.

Usage:
  clade daemon [--data-dir DIR] [--socket PATH] [--listen ADDR --token-file FILE]
  clade create [--image NAME] [--memory MIB] [--cpus N] [--env K=V]... [--name NAME]
               [--network internet|none] [--egress allow|deny] [--allow HOST|*.DOMAIN|CIDR]... [--deny CIDR]...
               [--public] [--idle-sleep DUR] [--timeout DUR [--on-timeout rm|sleep]]
  clade network ID [--egress allow|deny] [--allow RULE]... [--deny CIDR]...   show or replace the egress policy
  clade exec [-i] [-t] [--env K=V]... [--workdir DIR] [--timeout DUR] ID -- CMD [ARG...]
  clade events [--follow] [--since SEQ] [--sandbox ID] [--label K=V]... [--json]   lifecycle events
  clade ls [--json]
  clade inspect ID...
  clade rm [-f] ID...
  clade cp SRC DST            one side is ID:PATH; directories copy recursively
  clade image ls [--json] | inspect NAME|REF | rm NAME|REF...
  clade image pull REF [--name NAME] [--platform P] | clade image import FILE|DIR [--name NAME]
  clade image build NAME --from NAME|REF [--run CMD]... [--copy SRC:DST]... [--start CMD [--ready CMD]]
  clade bench [--phases LIST] [--fanout LIST] [--samples N] [--baseline] [--json FILE]
  clade snapshot ID [--name NAME]       freeze a running sandbox; it keeps running
  clade snapshot ls [--json] | clade snapshot rm SNAP...
  clade fork SNAP|ID -n N [--json]      N children in one call
  clade volume create NAME [--size S]   a named volume; clade create --volume NAME:/path[:ro]
  clade volume ls|inspect|rm NAME...
  clade secret set NAME [--from-file F] | secret ls | secret rm NAME...   sealed; create --secret NAME[:ENV]
  clade sleep ID | --all | --label K=V  to disk at zero RAM; clade wake ID: back
  clade timeout ID DUR [--on-timeout rm|sleep]   renew a sandbox's lifetime
  clade port-forward ID [LOCAL:]REMOTE  forward local TCP port LOCAL to REMOTE in the sandbox
  clade url [--ttl DUR] ID PORT         a URL of PORT through the ingress that needs no token until it expires
  clade create --from SNAP [--name NAME]
  clade stats [--no-stream] [--json] [ID...]  CPU, memory and processes, refreshed live
  clade mcp [--http ADDR [--token-file FILE]]  serve AI agents over the Model Context Protocol
  clade tui                             a live terminal view with keys to sleep, wake, snapshot, fork, remove
  clade completion bash|zsh|fish        shell completion of verbs, sandboxes, snapshots and images
  clade version

Global flags (before the verb):
  --host ADDR   daemon address: a unix socket path or http://HOST:PORT
                (default $CLADE_HOST, else ` + sdk.DefaultSocket + `)

Run 'clade VERB --help' for a verb's flags. ID is a sandbox id or name.
`

// exitError carries a process exit code out of a verb.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	host := ""
	for len(args) > 0 {
		switch {
		case (args[0] == "--host" || args[0] == "-host") && len(args) > 1:
			host, args = args[1], args[2:]
			continue
		case len(args[0]) > 7 && (args[0][:7] == "--host=" || args[0][:6] == "-host="):
			_, host, _ = cut(args[0], "=")
			args = args[1:]
			continue
		}
		break
	}
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	verb, rest := args[0], args[1:]
	var err error
	switch verb {
	case "daemon":
		err = cmdDaemon(ctx, rest)
	case "create":
		err = withClient(ctx, host, rest, cmdCreate)
	case "exec":
		stop() // exec forwards signals itself
		err = withClient(context.Background(), host, rest, cmdExec)
	case "ls", "list", "ps":
		err = withClient(ctx, host, rest, cmdList)
	case "inspect":
		err = withClient(ctx, host, rest, cmdInspect)
	case "rm", "remove":
		err = withClient(ctx, host, rest, cmdRemove)
	case "cp":
		err = withClient(ctx, host, rest, cmdCopy)
	case "image", "images":
		err = withClient(ctx, host, rest, cmdImage)
	case "bench":
		err = withClient(ctx, host, rest, cmdBench)
	case "snapshot", "snapshots":
		err = withClient(ctx, host, rest, cmdSnapshot)
	case "fork":
		err = withClient(ctx, host, rest, cmdFork)
	case "volume", "volumes":
		err = withClient(ctx, host, rest, cmdVolume)
	case "secret", "secrets":
		err = withClient(ctx, host, rest, cmdSecret)
	case "network":
		err = withClient(ctx, host, rest, cmdNetwork)
	case "sleep":
		err = withClient(ctx, host, rest, cmdSleep)
	case "wake":
		err = withClient(ctx, host, rest, cmdWake)
	case "timeout":
		err = withClient(ctx, host, rest, cmdTimeout)
	case "events":
		err = withClient(ctx, host, rest, cmdEvents)
	case "port-forward":
		err = withClient(ctx, host, rest, cmdPortForward)
	case "url":
		err = withClient(ctx, host, rest, cmdURL)
	case "stats":
		err = withClient(ctx, host, rest, cmdStats)
	case "mcp":
		err = withClient(ctx, host, rest, cmdMCP)
	case "tui", "top":
		err = withClient(ctx, host, rest, cmdTUI)
	case "completion":
		err = cmdCompletion(rest)
	case "__complete": // for the completion scripts
		err = cmdComplete(ctx, host, rest)
	case "version", "--version":
		fmt.Println("clade", versionString())
	case "help", "-h", "--help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "clade: unknown verb %q\n\n%s", verb, usage)
		return 2
	}
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, errUsage):
		return 2
	default:
		fmt.Fprintln(os.Stderr, "clade:", err)
		return 1
	}
}

func cut(s, sep string) (string, string, bool) {
	for i := 0; i+len(sep) <= len(s); i++ {
		if s[i:i+len(sep)] == sep {
			return s[:i], s[i+len(sep):], true
		}
	}
	return s, "", false
}

func withClient(ctx context.Context, host string, args []string, f func(context.Context, *sdk.Client, []string) error) error {
	c, err := sdk.New(host)
	if err != nil {
		return err
	}
	return f(ctx, c, args)
}
