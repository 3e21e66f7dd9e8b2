package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/clade-sandbox/clade/internal/tarx"
	"github.com/clade-sandbox/clade/sdk"
)

func newCreateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "create [flags]",
		Short: "Create a sandbox and print its id",
		Long:  "Creates a sandbox, from an image or (--from) a snapshot, waits until it is ready and prints its id.",
		Example: "  clade create --name box --memory 1024 --cpus 2\n" +
			"  clade create --image python:3.12-slim --network none --timeout 1h\n" +
			"  clade create --egress deny --allow pypi.org --allow '*.pythonhosted.org'\n" +
			"  clade create --volume data:/data --secret api-key:API_KEY\n" +
			"  clade create --from SNAP --name copy",
		Args: nargs(0, 0),
	}
	fs := cmd.Flags()
	var req sdk.CreateSandboxRequest
	var env, labels multi
	disk := fs.String("disk", "", "cap on what the sandbox may write, e.g. 2GiB or 512MiB (default: the daemon's --default-disk)")
	fs.Var(&labels, "label", "label `K=V` to find the sandbox by (repeatable)")
	fs.StringVar(&req.Image, "image", "", "`image` to boot: a name or a reference it was pulled as (see clade image ls; default: default)")
	fs.IntVar(&req.MemoryMiB, "memory", 0, "memory limit in MiB (default 512)")
	fs.Float64Var(&req.CPUs, "cpus", 0, "CPU limit in cores (default 1)")
	fs.Var(&env, "env", "environment variable `K=V` for every process (repeatable)")
	fs.StringVar(&req.Name, "name", "", "unique name, usable wherever an id is")
	fs.StringVar(&req.Engine, "engine", "", "engine to run the sandbox in: gvisor or qemu (a microVM; default: the daemon's)")
	fs.StringVar(&req.FromSnapshot, "from", "", "restore from this `snapshot` instead of booting the image")
	fs.StringVar(&req.Node, "node", "", "in a cluster, the node `NAME` to create the sandbox on (default: placement picks the node with the most memory free)")
	mode := fs.String("network", "", "internet (own address, egress under the policy) or none (loopback only); default: the daemon's --default-network")
	pol := policyFlags(fs)
	fs.BoolVar(&req.Public, "public", false, "serve the sandbox's ports through the daemon's ingress without its traffic token (by default requests need header X-Clade-Traffic-Token, shown by clade inspect)")
	idle := fs.Duration("idle-sleep", 0, "put the sandbox to sleep (zero RAM) after this long with no exec, file copy, ingress request or open ingress/port-forward connection, e.g. 5m; the next request wakes it (default: never)")
	timeout := fs.Duration("timeout", 0, "end the sandbox this long after its creation, e.g. 1h; renewable with: clade timeout ID DUR (default: never)")
	fs.StringVar(&req.OnTimeout, "on-timeout", "", "what --timeout does: rm removes the sandbox (default), sleep puts it to sleep (a wake starts a new --timeout), sleep-files to sleep keeping its files only (the wake starts it afresh)")
	volumes := volumeFlags(fs)
	secrets := secretFlags(fs)
	_ = cmd.RegisterFlagCompletionFunc("image", completeImages)
	_ = cmd.RegisterFlagCompletionFunc("volume", completeSuffix(":/", volumeNames))
	_ = cmd.RegisterFlagCompletionFunc("volume-shared", completeSuffix(":/", volumeNames))
	_ = cmd.RegisterFlagCompletionFunc("secret", completeSecrets)
	_ = cmd.RegisterFlagCompletionFunc("secret-file", completeSuffix(":/run/secrets/", secretNames))
	_ = cmd.RegisterFlagCompletionFunc("egress", fixedValues("allow", "deny"))
	_ = cmd.RegisterFlagCompletionFunc("from", completeSnapshots)
	_ = cmd.RegisterFlagCompletionFunc("engine", fixedValues("gvisor", "qemu"))
	_ = cmd.RegisterFlagCompletionFunc("network", fixedValues("internet", "none"))
	_ = cmd.RegisterFlagCompletionFunc("on-timeout", fixedValues("rm", "sleep", "sleep-files"))
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		var err error
		if req.Volumes, err = volumes(); err != nil {
			return err
		}
		if req.Secrets, err = secrets(); err != nil {
			return err
		}
		if *idle < 0 || *idle%time.Millisecond != 0 || *timeout < 0 || *timeout%time.Millisecond != 0 {
			return badArg("--idle-sleep and --timeout take a positive duration in whole milliseconds, e.g. 90s")
		}
		req.IdleSleepMS, req.TimeoutMS = idle.Milliseconds(), timeout.Milliseconds()
		if err := checkOnTimeout(req.OnTimeout); err != nil {
			return err
		}
		if err := checkEnv(env); err != nil {
			return err
		}
		req.Env = env
		if *disk != "" {
			mib, err := parseMiB(*disk)
			if err != nil {
				return badArg("--disk: %v", err)
			}
			req.DiskMiB = mib
		}
		if req.Labels, err = parseLabels(labels); err != nil {
			return err
		}
		if *mode != "" || pol.set() {
			n := pol.network()
			n.Mode = *mode
			req.Network = &n
		}
		sb, err := c.CreateSandbox(ctx, req)
		if err != nil {
			return err
		}
		fmt.Println(sb.ID)
		return nil
	})
	return cmd
}

func newExecCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "exec [flags] ID [--] CMD [ARG...]",
		Short: "Run a command in a sandbox",
		Long: "Runs CMD in the sandbox, streaming its output, and exits with its exit code\n" +
			"(128+N if killed by signal N, 124 on --timeout, 127 if CMD is not found).\n" +
			"Flags go before ID: everything after ID is the command and its arguments.\n" +
			"A sleeping sandbox is woken first.",
		Example: "  clade exec box -- python3 -c 'print(6*7)'\n" +
			"  clade exec -it box -- bash          # an interactive shell on a terminal\n" +
			"  echo hi | clade exec -i box -- cat\n" +
			"  clade exec --workdir /tmp --env X=1 --timeout 30s box -- make test\n" +
			"  clade exec --user 1000:1000 box -- id",
		Args:              nargs(2, -1),
		ValidArgsFunction: firstArg(completeSandboxes),
	}
	fs := cmd.Flags()
	fs.SetInterspersed(false)
	var env multi
	interactive := fs.BoolP("interactive", "i", false, "forward stdin to the command")
	tty := fs.BoolP("tty", "t", false, "run the command on a terminal in the sandbox (stdout and stderr merged);\nwith -i, keys go to it as typed (Ctrl-C interrupts it) and window size changes follow")
	fs.Var(&env, "env", "environment variable `K=V` (repeatable)")
	workdir := fs.String("workdir", "", "working `directory` inside the sandbox (default /, or the --user's home)")
	user := fs.StringP("user", "u", "", "run as this `NAME|UID[:GID]` of the sandbox, with its groups, HOME and login environment (default: the image's user)")
	timeout := fs.Duration("timeout", 0, "kill the command and its children after this long, e.g. 30s")
	cmd.RunE = func(cmd *cobra.Command, rest []string) error {
		ctx := context.Background() // exec forwards signals itself
		stopSignals()
		c, err := sdk.New(host)
		if err != nil {
			return err
		}
		return runExec(ctx, cmd, c, rest, env, *interactive, *tty, *workdir, *user, *timeout)
	}
	return cmd
}

func runExec(ctx context.Context, cobraCmd *cobra.Command, c *sdk.Client, rest []string, env multi, interactive, tty bool, workdir, user string, timeout time.Duration) error {
	if len(rest) > 0 && rest[0] == "--" {
		rest = rest[1:]
	}
	if len(rest) < 2 {
		return usagef(cobraCmd, "missing CMD\nUsage: %s", cobraCmd.UseLine())
	}
	ref, cmd := rest[0], rest[1:]
	if cmd[0] == "--" {
		cmd = cmd[1:]
	} else if strings.HasPrefix(cmd[0], "-") && len(cmd[0]) > 1 {
		// `clade exec box --env X=1 -- env`: a flag after the sandbox would
		// run as a command named --env and fail as not found.
		return usagef(cobraCmd, "%q after the sandbox %s would be the command: exec's flags go before ID "+
			"(put -- before a command that starts with -)\nUsage: %s", cmd[0], ref, cobraCmd.UseLine())
	}
	if len(cmd) == 0 {
		return usagef(cobraCmd, "missing CMD\nUsage: %s", cobraCmd.UseLine())
	}
	if err := checkEnv(env); err != nil {
		return usagef(cobraCmd, "%v", err)
	}
	if timeout < 0 {
		return usagef(cobraCmd, "--timeout %s: give a positive duration, e.g. 30s (none: no timeout)", timeout)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	req := sdk.ExecRequest{Cmd: cmd, Env: env, Workdir: workdir, User: user, Timeout: timeout,
		Stdout: os.Stdout, Stderr: os.Stderr, Signals: sigs}
	if interactive {
		req.Stdin = os.Stdin
	}
	if tty {
		lt, err := openLocalTerm(interactive)
		if err != nil {
			return err
		}
		defer lt.restore()
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		req.TTY, req.Size, req.Resizes = true, lt.size, lt.resizes
		if interactive && !term.IsTerminal(int(os.Stdin.Fd())) {
			// A terminal has no end of input but its EOF character: piped
			// into, the command would wait for more forever.
			req.Stdin = &eofOnTTY{r: os.Stdin}
		}
		req.Signals = forwardSignals(sigs, lt.done, cancel)
		if t := os.Getenv("TERM"); t != "" && !hasEnv(env, "TERM") {
			req.Env = append([]string{"TERM=" + t}, req.Env...)
		}
	}
	st, err := c.Exec(ctx, ref, req)
	if err != nil {
		return err
	}
	switch {
	case st.TimedOut:
		fmt.Fprintf(os.Stderr, "clade: command timed out after %s\n", timeout)
		return exitError{124}
	case st.Error != "":
		fmt.Fprintln(os.Stderr, "clade:", st.Error)
	}
	return exitError{st.Code}
}

// policyFlagSet holds are the egress policy flags of create and network.
type policyFlagSet struct {
	egress      *string
	allow, deny multi
}

func policyFlags(fs *pflag.FlagSet) *policyFlagSet {
	p := &policyFlagSet{egress: fs.String("egress", "", "allow or deny: what happens to destinations no rule names (default allow)")}
	fs.Var(&p.allow, "allow", "allow a `RULE`: HOST, *.DOMAIN or IPv4 CIDR (repeatable); any makes the policy an allowlist")
	fs.Var(&p.deny, "deny", "refuse this IPv4 `CIDR` (repeatable)")
	return p
}

func (p *policyFlagSet) set() bool { return *p.egress != "" || len(p.allow) > 0 || len(p.deny) > 0 }

func (p *policyFlagSet) network() sdk.Network {
	return sdk.Network{Egress: *p.egress, Allow: p.allow, Deny: p.deny}
}

func newNetworkCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "network ID [flags]",
		Short: "Show, replace or change a sandbox's egress policy",
		Long: "Without flags prints the sandbox's network (mode, policy, address) as JSON.\n" +
			"--allow, --deny and --egress REPLACE the whole egress policy: what is not given\n" +
			"takes the default (egress allow, no rules), so `--allow x` drops every other rule.\n" +
			"--add-allow, --remove-allow, --add-deny and --remove-deny change only the rules\n" +
			"they name and keep the others (with them, --egress sets just the default); the\n" +
			"daemon applies the change under the sandbox's lock. Removing the last allow rule\n" +
			"leaves egress deny: nothing allowed. A running sandbox follows at once.",
		Example: "  clade network box --egress deny --allow github.com --allow 10.0.0.0/8\n" +
			"  clade network box --add-allow pypi.org --remove-allow github.com",
		Args:              nargs(1, 1),
		ValidArgsFunction: firstArg(completeSandboxes),
	}
	pol := policyFlags(cmd.Flags())
	var ch sdk.NetworkChange
	fs := cmd.Flags()
	fs.Var((*multi)(&ch.AddAllow), "add-allow", "add an allow `RULE` (HOST, *.DOMAIN or IPv4 CIDR), keeping the others (repeatable)")
	fs.Var((*multi)(&ch.RemoveAllow), "remove-allow", "remove an allow `RULE`, keeping the others (repeatable)")
	fs.Var((*multi)(&ch.AddDeny), "add-deny", "add a deny `CIDR`, keeping the others (repeatable)")
	fs.Var((*multi)(&ch.RemoveDeny), "remove-deny", "remove a deny `CIDR`, keeping the others (repeatable)")
	_ = cmd.RegisterFlagCompletionFunc("egress", fixedValues("allow", "deny"))
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		ref := args[0]
		var sb sdk.Sandbox
		var err error
		edits := len(ch.AddAllow) + len(ch.RemoveAllow) + len(ch.AddDeny) + len(ch.RemoveDeny)
		switch {
		case edits > 0 && (len(pol.allow) > 0 || len(pol.deny) > 0):
			return badArg("--allow/--deny replace the whole policy, --add-*/--remove-* change it: give one kind")
		case edits > 0:
			ch.Egress = *pol.egress
			sb, err = c.ChangeNetwork(ctx, ref, ch)
		case pol.set():
			sb, err = c.SetNetwork(ctx, ref, pol.network())
		default:
			sb, err = c.GetSandbox(ctx, ref)
		}
		if err != nil {
			return err
		}
		if sb.Network == nil {
			return printJSON(sdk.Network{Mode: "none"})
		}
		return printJSON(sb.Network)
	})
	return cmd
}

func newListCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "ls [flags]",
		Aliases: []string{"list", "ps"},
		Short:   "List sandboxes",
		Example: "  clade ls --label team=ml --json\n  clade rm -f $(clade ls -q --label team=ml)",
		Args:    nargs(0, 0),
	}
	fs := cmd.Flags()
	asJSON := fs.Bool("json", false, "print JSON")
	quiet := fs.BoolP("quiet", "q", false, "print only the ids, one a line")
	var labels multi
	fs.Var(&labels, "label", "list only sandboxes with label `K=V` (repeatable: all must match)")
	node := fs.String("node", "", "in a cluster, list only the sandboxes node `NAME` holds")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		want, err := parseLabels(labels)
		if err != nil {
			return err
		}
		if *asJSON && *quiet {
			return badArg("--json and --quiet: give one")
		}
		sbs, err := c.ListSandboxesLabeled(ctx, want)
		if err != nil {
			return err
		}
		if *node != "" {
			sbs = slices.DeleteFunc(sbs, func(sb sdk.Sandbox) bool { return sb.Node != *node })
		}
		if *asJSON {
			return printJSON(sbs)
		}
		if *quiet {
			for _, sb := range sbs {
				fmt.Println(sb.ID)
			}
			return nil
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		// A cluster's list says where each sandbox is.
		cluster := slices.ContainsFunc(sbs, func(sb sdk.Sandbox) bool { return sb.Node != "" && sb.Node != "local" })
		if cluster {
			fmt.Fprintln(tw, "ID\tNAME\tNODE\tIMAGE\tSTATE\tMEMORY\tCPUS\tCREATED")
		} else {
			fmt.Fprintln(tw, "ID\tNAME\tIMAGE\tSTATE\tMEMORY\tCPUS\tCREATED")
		}
		for _, sb := range sbs {
			if cluster {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%dMiB\t%g\t%s ago\n", sb.ID, dash(sb.Name), sb.Node, sb.Image, sb.State, sb.MemoryMiB, sb.CPUs,
					time.Since(sb.CreatedAt).Round(time.Second))
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%dMiB\t%g\t%s ago\n", sb.ID, dash(sb.Name), sb.Image, sb.State, sb.MemoryMiB, sb.CPUs,
				time.Since(sb.CreatedAt).Round(time.Second))
		}
		return tw.Flush()
	})
	return cmd
}

// checkEnv refuses --env values the daemon would: each must be K=V.
func checkEnv(env []string) error {
	for _, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return badArg("--env %q: use KEY=VALUE", kv)
		}
	}
	return nil
}

// checkOnTimeout refuses an --on-timeout the daemon would.
func checkOnTimeout(v string) error {
	switch v {
	case "", "rm", "sleep", "sleep-files":
		return nil
	}
	return badArg("--on-timeout %q: use rm (remove the sandbox), sleep (put it to sleep) or sleep-files (to sleep keeping its files only: the wake starts it afresh)", v)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newInspectCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "inspect ID...",
		Short: "Print sandboxes as JSON",
		Long: "Prints each sandbox's record as JSON: state, resources, labels, network,\n" +
			"ingress URL and traffic token, timeouts. One ID prints an object, several\n" +
			"an array of them.",
		Example:           "  clade inspect box\n  clade inspect box other | jq '.[].state'",
		Args:              nargs(1, -1),
		ValidArgsFunction: completeSandboxes,
	}
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		var out []sdk.Sandbox
		for _, ref := range args {
			sb, err := c.GetSandbox(ctx, ref)
			if err != nil {
				return err
			}
			out = append(out, sb)
		}
		if len(out) == 1 {
			return printJSON(out[0])
		}
		return printJSON(out)
	})
	return cmd
}

func newRemoveCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:               "rm [flags] ID...",
		Aliases:           []string{"remove"},
		Short:             "Remove sandboxes, stopping what runs in them",
		Long:              "Removes sandboxes, stopping what runs in them (running, sleeping or stopped).\nPrints each one removed; a sandbox that does not exist is an error unless -f.",
		Example:           "  clade rm box\n  clade rm -f box other",
		Args:              nargs(1, -1),
		ValidArgsFunction: completeSandboxes,
	}
	force := cmd.Flags().BoolP("force", "f", false, "do not fail on sandboxes that do not exist")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		return removeEach(args, *force, func(ref string) error { return c.DeleteSandbox(ctx, ref) })
	})
	return cmd
}

// removeEach removes every ref, printing each removed one and reporting
// each failure; it fails at the end if any did. With force a ref that does
// not exist is not a failure.
func removeEach(refs []string, force bool, remove func(string) error) error {
	failed := false
	for _, ref := range refs {
		if err := remove(ref); err != nil {
			if force && sdk.IsNotFound(err) {
				continue
			}
			fmt.Fprintln(os.Stderr, "clade:", err)
			failed = true
			continue
		}
		fmt.Println(ref)
	}
	if failed {
		return exitError{1}
	}
	return nil
}

// splitRef parses "ID:PATH"; local paths (containing a '/' before any ':',
// or no ':') are not sandbox references.
func splitRef(s string) (ref, path string, ok bool) {
	i := strings.IndexByte(s, ':')
	if i <= 0 || strings.Contains(s[:i], "/") {
		return "", s, false
	}
	return s[:i], s[i+1:], true
}

func newCopyCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files between the host and a sandbox",
		Long: "Copies files between the host and a sandbox; one of SRC and DST is ID:PATH\n" +
			"with an absolute PATH. Directories copy recursively. If DST is an existing\n" +
			"directory SRC is copied into it, else SRC is copied as DST. On the host a\n" +
			"symlink DST is replaced, not followed (a sandbox may have made it): end DST\n" +
			"with / to copy into the directory it points to. As in docker cp,\n" +
			"- as DST writes a tar archive of SRC to stdout, and - as SRC reads a tar\n" +
			"archive from stdin and unpacks it into the sandbox directory DST.",
		Example: "  clade cp ./src box:/work/\n  clade cp box:/work/out.csv .\n" +
			"  clade cp box:/work - | tar -t\n  tar -c ./src | clade cp - box:/work\n" +
			"  clade cp --user 1000:1000 ./src box:/home/user/",
		Args: nargs(2, 2),
		ValidArgsFunction: func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			if strings.Contains(toComplete, ":") || strings.Contains(toComplete, "/") {
				return nil, cobra.ShellCompDirectiveDefault
			}
			return completeSuffix(":", sandboxNames)(cmd, args, toComplete)
		},
	}
	user := cmd.Flags().StringP("user", "u", "", "copying into a sandbox: make what is written owned by this `NAME|UID[:GID]` of the sandbox\n(default: the archive's owners)")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		return runCopy(ctx, c, args[0], args[1], *user)
	})
	return cmd
}

func runCopy(ctx context.Context, c *sdk.Client, src, dst, user string) error {
	sref, spath, sIn := splitRef(src)
	dref, dpath, dIn := splitRef(dst)
	switch {
	case sIn && dIn:
		return badArg("copy between two sandboxes is not supported: copy through the host")
	case !sIn && !dIn:
		return badArg("one of SRC and DST must be ID:PATH, e.g. clade cp ./f box:/tmp/")
	case user != "" && !dIn:
		return badArg("--user is for copies into a sandbox: it names who owns what is written")
	case dIn && src == "-":
		return c.CopyToAs(ctx, dref, dpath, user, os.Stdin)
	case sIn && dst == "-":
		rc, err := c.CopyFrom(ctx, sref, spath)
		if err != nil {
			return err
		}
		defer rc.Close()
		_, err = io.Copy(os.Stdout, rc)
		return err
	case dIn:
		if _, err := os.Lstat(spath); err != nil {
			return fmt.Errorf("cp: %w", err)
		}
		pr, pw := io.Pipe()
		go func() {
			pw.CloseWithError(tarx.Create(pw, spath, filepath.Base(filepath.Clean(spath))))
		}()
		err := c.CopyToAs(ctx, dref, dpath, user, pr)
		pr.CloseWithError(errors.New("upload ended"))
		return err
	default:
		rc, err := c.CopyFrom(ctx, sref, spath)
		if err != nil {
			return err
		}
		defer rc.Close()
		abs, err := filepath.Abs(dpath)
		if err != nil {
			return err
		}
		// The sandbox chooses what lands at DST (a symlink to any host
		// directory, say), so DST is not followed unless the user asks
		// with a trailing slash, and the archive may hold nothing but
		// SRC's base name: see tarx.ExtractTo.
		stat, top := os.Lstat, path.Base(path.Clean(spath))
		if strings.HasSuffix(dpath, "/") && abs != "/" {
			stat, abs = os.Stat, abs+"/"
		}
		if top == "/" {
			top = "" // an archive of / holds its children
		}
		// What the copy makes: DST, or the source's base name inside an
		// existing directory DST. A failed copy removes it if it is new.
		made := filepath.Clean(abs)
		if fi, err := stat(made); err == nil && fi.IsDir() {
			made = filepath.Join(made, top)
		}
		_, existed := os.Lstat(made)
		if err := tarx.ExtractTo(abs, rc, tarx.Options{Top: top}); err != nil {
			if existed != nil {
				err = errors.Join(err, os.RemoveAll(made))
			}
			return err
		}
		return nil
	}
}

// parseMiB reads a size such as 512, 512M, 512MiB, 2G or 2GiB as MiB (a
// bare number is MiB).
func parseMiB(s string) (int, error) {
	t := strings.TrimSpace(strings.ToUpper(s))
	mult := 1
	for _, u := range []struct {
		suffix string
		mult   int
	}{{"TIB", 1 << 20}, {"GIB", 1 << 10}, {"MIB", 1}, {"TB", 1 << 20}, {"GB", 1 << 10}, {"MB", 1}, {"T", 1 << 20}, {"G", 1 << 10}, {"M", 1}} {
		if rest, ok := strings.CutSuffix(t, u.suffix); ok {
			t, mult = strings.TrimSpace(rest), u.mult
			break
		}
	}
	n, err := strconv.Atoi(t)
	if err != nil || n <= 0 || n > (1<<40)/mult {
		return 0, fmt.Errorf("bad size %q: use a positive whole number of MiB, or one with M, MiB, G, GiB, T or TiB, e.g. 2GiB", s)
	}
	return n * mult, nil
}
