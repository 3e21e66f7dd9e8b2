package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/clade-sandbox/clade/internal/tarx"
	"github.com/clade-sandbox/clade/sdk"
)

// errUsage means the flags were wrong; the flag package already said why.
var errUsage = errors.New("usage")

// multi collects a repeatable string flag.
type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func newFlags(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: clade %s\n", synopsis)
		var any bool
		fs.VisitAll(func(*flag.Flag) { any = true })
		if any {
			fmt.Fprintln(fs.Output(), "\nFlags:")
			fs.PrintDefaults()
		}
	}
	return fs
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitError{0}
		}
		return errUsage
	}
	return nil
}

func cmdCreate(ctx context.Context, c *sdk.Client, args []string) error {
	fs := newFlags("create", "create [--image REF] [--memory MIB] [--cpus N] [--disk SIZE] [--env K=V]... [--label K=V]... [--name NAME]\n       [--network internet|none] [--egress allow|deny] [--allow HOST|*.DOMAIN|CIDR]... [--deny CIDR]...\n              [--public] [--idle-sleep DUR] [--timeout DUR [--on-timeout rm|sleep]]\n              [--volume NAME:/path[:ro]]... [--volume-shared NAME:/path[:ro]]...\n              [--secret NAME[:ENVVAR]]... [--secret-file NAME:/run/secrets/FILE]...\n       clade create --from SNAP [--name NAME]\n\nCreates a sandbox, waits until it is ready and prints its id.")
	var req sdk.CreateSandboxRequest
	var env, labels multi
	disk := fs.String("disk", "", "cap on what the sandbox may write, e.g. 2GiB or 512MiB (default: the daemon's --default-disk)")
	fs.Var(&labels, "label", "label K=V to find the sandbox by (repeatable)")
	fs.StringVar(&req.Image, "image", "", "image to boot: a name or a reference it was pulled as (see `clade image ls`; default: default)")
	fs.IntVar(&req.MemoryMiB, "memory", 0, "memory limit in MiB (default 512)")
	fs.Float64Var(&req.CPUs, "cpus", 0, "CPU limit in cores (default 1)")
	fs.Var(&env, "env", "environment variable K=V for every process (repeatable)")
	fs.StringVar(&req.Name, "name", "", "unique name, usable wherever an id is")
	fs.StringVar(&req.Engine, "engine", "", "engine to run the sandbox in: gvisor or qemu (a microVM; default: the daemon's)")
	fs.StringVar(&req.FromSnapshot, "from", "", "restore from this snapshot instead of booting the image")
	mode := fs.String("network", "", "internet (own address, egress under the policy) or none (loopback only); default: the daemon's --default-network")
	pol := policyFlags(fs)
	fs.BoolVar(&req.Public, "public", false, "serve the sandbox's ports through the daemon's ingress without its traffic token (by default requests need header X-Clade-Traffic-Token, shown by clade inspect)")
	idle := fs.Duration("idle-sleep", 0, "put the sandbox to sleep (zero RAM) after this long with no exec, file copy, ingress request or open ingress/port-forward connection, e.g. 5m; the next request wakes it (default: never)")
	timeout := fs.Duration("timeout", 0, "end the sandbox this long after its creation, e.g. 1h; renewable with: clade timeout ID DUR (default: never)")
	fs.StringVar(&req.OnTimeout, "on-timeout", "", "what --timeout does: rm removes the sandbox (default), sleep puts it to sleep (a wake starts a new --timeout)")
	volumes := volumeFlags(fs)
	secrets := secretFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	var err error
	if req.Volumes, err = volumes(); err != nil {
		return err
	}
	if req.Secrets, err = secrets(); err != nil {
		return err
	}
	if *idle < 0 || *idle%time.Millisecond != 0 || *timeout < 0 || *timeout%time.Millisecond != 0 {
		return errors.New("--idle-sleep and --timeout take a positive duration in whole milliseconds, e.g. 90s")
	}
	req.IdleSleepMS, req.TimeoutMS = idle.Milliseconds(), timeout.Milliseconds()
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "clade create: unexpected argument %q\n", fs.Arg(0))
		return errUsage
	}
	req.Env = env
	if *disk != "" {
		mib, err := parseMiB(*disk)
		if err != nil {
			return fmt.Errorf("--disk: %w", err)
		}
		req.DiskMiB = mib
	}
	for _, kv := range labels {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("--label %q: use KEY=VALUE", kv)
		}
		if req.Labels == nil {
			req.Labels = map[string]string{}
		}
		req.Labels[k] = v
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
}

func cmdExec(ctx context.Context, c *sdk.Client, args []string) error {
	fs := newFlags("exec", "exec [-i] [-t] [--env K=V]... [--workdir DIR] [--timeout DUR] ID -- CMD [ARG...]\n\nRuns CMD in the sandbox, streaming its output, and exits with its exit code\n(128+N if killed by signal N, 124 on --timeout, 127 if CMD is not found).\n`clade exec -it ID -- bash` is an interactive shell on a terminal in the sandbox.")
	var env multi
	interactive := fs.Bool("i", false, "forward stdin to the command")
	tty := fs.Bool("t", false, "run the command on a terminal in the sandbox (stdout and stderr merged); with -i, keys go to it as typed (Ctrl-C interrupts it) and window size changes follow")
	fs.Var(&env, "env", "environment variable K=V (repeatable)")
	workdir := fs.String("workdir", "", "working directory inside the sandbox (default /)")
	timeout := fs.Duration("timeout", 0, "kill the command and its children after this long, e.g. 30s")
	if err := parse(fs, expandShortFlags(fs, args)); err != nil {
		return err
	}
	rest := fs.Args()
	if len(rest) > 0 && rest[0] == "--" {
		rest = rest[1:]
	}
	if len(rest) < 2 {
		fs.Usage()
		return errUsage
	}
	ref, cmd := rest[0], rest[1:]
	if cmd[0] == "--" {
		cmd = cmd[1:]
	}
	if len(cmd) == 0 {
		fs.Usage()
		return errUsage
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	req := sdk.ExecRequest{Cmd: cmd, Env: env, Workdir: *workdir, Timeout: *timeout,
		Stdout: os.Stdout, Stderr: os.Stderr, Signals: sigs}
	if *interactive {
		req.Stdin = os.Stdin
	}
	if *tty {
		lt, err := openLocalTerm(*interactive)
		if err != nil {
			return err
		}
		defer lt.restore()
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		req.TTY, req.Size, req.Resizes = true, lt.size, lt.resizes
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
		fmt.Fprintf(os.Stderr, "clade: command timed out after %s\n", *timeout)
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

func policyFlags(fs *flag.FlagSet) *policyFlagSet {
	p := &policyFlagSet{egress: fs.String("egress", "", "allow or deny: what happens to destinations no rule names (default allow)")}
	fs.Var(&p.allow, "allow", "allow HOST, *.DOMAIN or IPv4 CIDR (repeatable); any makes the policy an allowlist")
	fs.Var(&p.deny, "deny", "refuse this IPv4 CIDR (repeatable)")
	return p
}

func (p *policyFlagSet) set() bool { return *p.egress != "" || len(p.allow) > 0 || len(p.deny) > 0 }

func (p *policyFlagSet) network() sdk.Network {
	return sdk.Network{Egress: *p.egress, Allow: p.allow, Deny: p.deny}
}

func cmdNetwork(ctx context.Context, c *sdk.Client, args []string) error {
	fs := newFlags("network", "network ID [--egress allow|deny] [--allow RULE]... [--deny CIDR]...\n\nWithout flags prints the sandbox's network (mode, policy, address) as JSON.\nWith flags replaces its egress policy: what is not given takes the default\n(egress allow, no rules). A running sandbox follows it at once.")
	pol := policyFlags(fs)
	ref, err := parseOneArg(fs, args)
	if err != nil {
		return err
	}
	var sb sdk.Sandbox
	if pol.set() {
		sb, err = c.SetNetwork(ctx, ref, pol.network())
	} else {
		sb, err = c.GetSandbox(ctx, ref)
	}
	if err != nil {
		return err
	}
	if sb.Network == nil {
		return printJSON(sdk.Network{Mode: "none"})
	}
	return printJSON(sb.Network)
}

func cmdList(ctx context.Context, c *sdk.Client, args []string) error {
	fs := newFlags("ls", "ls [--json] [--label K=V]...\n\nLists sandboxes.")
	asJSON := fs.Bool("json", false, "print JSON")
	var labels multi
	fs.Var(&labels, "label", "list only sandboxes with label K=V (repeatable: all must match)")
	if err := parse(fs, args); err != nil {
		return err
	}
	want, err := parseLabels(labels)
	if err != nil {
		return err
	}
	sbs, err := c.ListSandboxesLabeled(ctx, want)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(sbs)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tIMAGE\tSTATE\tMEMORY\tCPUS\tCREATED")
	for _, sb := range sbs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%dMiB\t%g\t%s ago\n", sb.ID, dash(sb.Name), sb.Image, sb.State, sb.MemoryMiB, sb.CPUs,
			time.Since(sb.CreatedAt).Round(time.Second))
	}
	return tw.Flush()
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

func cmdInspect(ctx context.Context, c *sdk.Client, args []string) error {
	fs := newFlags("inspect", "inspect ID...\n\nPrints sandboxes as JSON.")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errUsage
	}
	var out []sdk.Sandbox
	for _, ref := range fs.Args() {
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
}

func cmdRemove(ctx context.Context, c *sdk.Client, args []string) error {
	fs := newFlags("rm", "rm [-f] ID...\n\nRemoves sandboxes, stopping what runs in them.")
	force := fs.Bool("f", false, "do not fail on sandboxes that do not exist")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errUsage
	}
	return removeEach(fs.Args(), *force, func(ref string) error { return c.DeleteSandbox(ctx, ref) })
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

func cmdCopy(ctx context.Context, c *sdk.Client, args []string) error {
	fs := newFlags("cp", "cp SRC DST\n\nCopies files between the host and a sandbox; one of SRC and DST is ID:PATH\nwith an absolute PATH. Directories copy recursively. If DST is an existing\ndirectory SRC is copied into it, else SRC is copied as DST.")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 2 {
		fs.Usage()
		return errUsage
	}
	src, dst := fs.Arg(0), fs.Arg(1)
	sref, spath, sIn := splitRef(src)
	dref, dpath, dIn := splitRef(dst)
	switch {
	case sIn && dIn:
		return errors.New("cp: copy between two sandboxes is not supported: copy through the host")
	case !sIn && !dIn:
		return errors.New("cp: one of SRC and DST must be ID:PATH")
	case dIn:
		if _, err := os.Lstat(spath); err != nil {
			return fmt.Errorf("cp: %w", err)
		}
		pr, pw := io.Pipe()
		go func() {
			pw.CloseWithError(tarx.Create(pw, spath, filepath.Base(filepath.Clean(spath))))
		}()
		err := c.CopyTo(ctx, dref, dpath, pr)
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
		// What the copy makes: DST, or the source's base name inside an
		// existing directory DST. A failed copy removes it if it is new.
		made := abs
		if fi, err := os.Stat(abs); err == nil && fi.IsDir() {
			made = filepath.Join(abs, path.Base(spath))
		}
		_, existed := os.Lstat(made)
		if err := tarx.ExtractTo(abs, rc, tarx.Options{}); err != nil {
			if existed != nil {
				err = errors.Join(err, os.RemoveAll(made))
			}
			return err
		}
		return nil
	}
}

const imageUsage = `Usage: clade image ls [--json]
       clade image pull REF [--name NAME] [--platform linux/amd64] [--quiet] [--insecure]
       clade image import FILE|DIR [--name NAME] [--quiet]  a docker save tarball, an OCI layout dir or its tar
       clade image build NAME --from IMAGE [--run CMD]... [--copy SRC:DST]... [--env K=V]... [--workdir DIR] [--start CMD [--ready CMD]]
       clade image inspect NAME
       clade image rm NAME...`

func cmdImage(ctx context.Context, c *sdk.Client, args []string) error {
	if len(args) > 0 {
		switch args[0] {
		case "pull":
			return cmdImagePull(ctx, c, args[1:])
		case "import":
			return cmdImageImport(ctx, c, args[1:])
		case "build":
			return cmdImageBuild(ctx, c, args[1:])
		case "inspect":
			return cmdImageInspect(ctx, c, args[1:])
		case "rm", "remove":
			fs := newFlags("image rm", "image rm NAME|REF...\n\nRemoves images no sandbox or snapshot uses, by name or by the reference\nthey were pulled or imported as.")
			if err := parse(fs, args[1:]); err != nil {
				return err
			}
			if fs.NArg() == 0 {
				fs.Usage()
				return errUsage
			}
			return removeEach(fs.Args(), false, func(name string) error { return c.DeleteImage(ctx, name) })
		}
	}
	if len(args) == 0 || (args[0] != "ls" && args[0] != "list") {
		fmt.Fprintln(os.Stderr, imageUsage)
		if len(args) > 0 && (args[0] == "--help" || args[0] == "-h") {
			return nil
		}
		return errUsage
	}
	fs := newFlags("image ls", "image ls [--json]\n\nLists images.")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	imgs, err := c.ListImages(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(imgs)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tREF\tSIZE\tCREATED\tSOURCE")
	for _, img := range imgs {
		ref := img.Ref
		if ref == "" {
			ref = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%dMiB\t%s\t%s\n", img.Name, ref, img.SizeBytes>>20, img.CreatedAt.Format(time.DateOnly), img.Source)
	}
	return tw.Flush()
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
		return 0, fmt.Errorf("bad size %q: use a whole number of MiB, or a number with M, MiB, G, GiB or T, e.g. 2GiB", s)
	}
	return n * mult, nil
}
