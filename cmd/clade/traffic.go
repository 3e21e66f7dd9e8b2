package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/clade-sandbox/clade/internal/ingress"
	"github.com/clade-sandbox/clade/sdk"
)

// parseLabels reads K=V flags; a malformed one is a usage error, and so is
// a key given two values (as a filter, a=1 and a=2 match nothing: keeping
// the last would have matched, and slept, every a=2 sandbox).
func parseLabels(kvs []string) (map[string]string, error) {
	var out map[string]string
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, badArg("--label %q: use KEY=VALUE", kv)
		}
		if old, dup := out[k]; dup && old != v {
			return nil, badArg("--label %s given twice (%q, %q): give each key once", k, old, v)
		}
		if out == nil {
			out = map[string]string{}
		}
		out[k] = v
	}
	return out, nil
}

func newSleepCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sleep ID... | --all | --label K=V...",
		Short: "Put sandboxes to sleep: to disk, at zero RAM",
		Long: "Snapshots sandboxes to disk and stops them: each keeps its id and uses no\n" +
			"memory until `clade wake`, the next exec or the next ingress request.\n" +
			"With --no-memory a sandbox keeps its files but not its processes: its wake\n" +
			"starts it afresh on its files, as a new sandbox starts (E2B's pause with\n" +
			"memory: false).",
		Example:           "  clade sleep box\n  clade sleep --label team=ml\n  clade sleep --all\n  clade sleep --no-memory box",
		Args:              cobra.ArbitraryArgs,
		ValidArgsFunction: completeSandboxes,
	}
	all := cmd.Flags().Bool("all", false, "put every running sandbox to sleep")
	noMemory := cmd.Flags().Bool("no-memory", false, "keep the files but not the processes: the wake starts the sandbox afresh")
	var labels multi
	cmd.Flags().Var(&labels, "label", "put the running sandboxes with label `K=V` to sleep (repeatable: all must match)")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, refs []string) error {
		want, err := parseLabels(labels)
		if err != nil {
			return err
		}
		if (len(refs) > 0) == (*all || want != nil) {
			if len(refs) == 0 {
				return usagef(cmd, "give sandboxes, --all or --label\nUsage: %s", cmd.UseLine())
			}
			return usagef(cmd, "give sandboxes or --all or --label, not both\nUsage: %s", cmd.UseLine())
		}
		if len(refs) == 0 {
			sbs, err := c.ListSandboxesLabeled(ctx, want)
			if err != nil {
				return err
			}
			for _, sb := range sbs {
				if sb.State == "running" {
					refs = append(refs, sb.ID)
				}
			}
			if len(refs) == 0 {
				// Not an error (nothing to do), but said, so that a
				// mistyped label is not taken for success.
				fmt.Fprintln(os.Stderr, "clade: no running sandbox matched: nothing put to sleep")
				return nil
			}
		}
		failed := false
		for _, ref := range refs {
			sleep := c.Sleep
			if *noMemory {
				sleep = c.SleepFiles
			}
			sb, err := sleep(ctx, ref)
			if err != nil {
				fmt.Fprintln(os.Stderr, "clade:", err)
				failed = true
				continue
			}
			fmt.Println(sb.ID)
		}
		if failed {
			return exitError{1}
		}
		return nil
	})
	return cmd
}

func newTimeoutCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "timeout ID DUR [flags]",
		Short: "Renew a sandbox's lifetime",
		Long: "Renews a sandbox's timeout: it now ends DUR from now (e.g. 30m; 0 removes\n" +
			"the timeout), by removal or sleep as --on-timeout says.",
		Example:           "  clade timeout box 2h\n  clade timeout box 30m --on-timeout sleep\n  clade timeout box 0",
		Args:              nargs(2, 2),
		ValidArgsFunction: firstArg(completeSandboxes),
	}
	onTimeout := cmd.Flags().String("on-timeout", "", "what the timeout does: rm removes the sandbox, sleep puts it to sleep (default: as before, else rm)")
	_ = cmd.RegisterFlagCompletionFunc("on-timeout", fixedValues("rm", "sleep", "sleep-files"))
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, pos []string) error {
		d, err := time.ParseDuration(pos[1])
		if err != nil || d < 0 {
			return badArg("timeout %q: give a duration such as 90s, 30m or 2h (0 removes the timeout)", pos[1])
		}
		if err := checkOnTimeout(*onTimeout); err != nil {
			return err
		}
		sb, err := c.SetTimeout(ctx, pos[0], d, *onTimeout)
		if err != nil {
			return err
		}
		if sb.ExpiresAt != nil {
			fmt.Printf("%s %s at %s\n", sb.ID, sb.OnTimeout, sb.ExpiresAt.Local().Format(time.RFC3339))
		} else {
			fmt.Printf("%s no timeout\n", sb.ID)
		}
		return nil
	})
	return cmd
}

// maxURLTTL is the longest --ttl the daemon signs a URL for.
const maxURLTTL = 30 * 24 * time.Hour

func newURLCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "url [flags] ID PORT",
		Short: "Print a URL of a sandbox's port that needs no token until it expires",
		Long: "Prints a URL of port PORT inside the sandbox, through the daemon's ingress, that\n" +
			"needs no traffic token until it expires (--ttl, default 1h, at most 30 days):\n" +
			"open it in a browser or hand it to someone. It is for that sandbox and port only.",
		Example:           "  clade url --ttl 24h box 8000",
		Args:              nargs(2, 2),
		ValidArgsFunction: firstArg(completeSandboxes),
	}
	ttl := cmd.Flags().Duration("ttl", time.Hour, "how long the URL works, e.g. 15m or 24h")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, pos []string) error {
		port, err := strconv.Atoi(pos[1])
		if err != nil || port < 1 || port > 65535 {
			return badArg("port %q: give a TCP port, 1 to 65535", pos[1])
		}
		// The API counts whole milliseconds and reads 0 as its default, an
		// hour: a --ttl under a millisecond must not become one.
		if *ttl < time.Millisecond || *ttl > maxURLTTL {
			return badArg("--ttl %s: give a duration from 1ms to 30 days (720h), e.g. 15m", *ttl)
		}
		u, err := c.SignedURL(ctx, pos[0], port, *ttl)
		if err != nil {
			return err
		}
		fmt.Println(u.URL)
		fmt.Fprintf(os.Stderr, "valid until %s\n", u.ExpiresAt.Local().Format(time.RFC3339))
		return nil
	})
	return cmd
}

func newPortForwardCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "port-forward [flags] ID [LOCAL:]REMOTE",
		Short: "Forward a local TCP port to a port in a sandbox",
		Long: "Forwards TCP connections to local port LOCAL (default: REMOTE; 0 picks a free\n" +
			"one) to port REMOTE inside the sandbox, through the daemon, until\n" +
			"interrupted. A connection to a sleeping sandbox wakes it. Prints the local\n" +
			"address it listens on.",
		Example:           "  clade port-forward db 15432:5432",
		Args:              nargs(2, 2),
		ValidArgsFunction: firstArg(completeSandboxes),
	}
	addr := cmd.Flags().String("address", "127.0.0.1", "local `address` to listen on")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, pos []string) error {
		ref := pos[0]
		local, remote, found := strings.Cut(pos[1], ":")
		if !found {
			local, remote = pos[1], pos[1]
		}
		rport, err := strconv.Atoi(remote)
		lport, lerr := strconv.Atoi(local)
		if err != nil || lerr != nil || rport < 1 || rport > 65535 || lport < 0 || lport > 65535 {
			return badArg("port-forward %q: use [LOCAL:]REMOTE with TCP ports, e.g. 5432 or 15432:5432", pos[1])
		}
		// Fail early on an unknown sandbox.
		if _, err := c.GetSandbox(ctx, ref); err != nil {
			return err
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(*addr, strconv.Itoa(lport)))
		if err != nil {
			return err
		}
		defer ln.Close()
		stop := context.AfterFunc(ctx, func() { ln.Close() })
		defer stop()
		fmt.Printf("forwarding %s -> %s:%d\n", ln.Addr(), ref, rport)
		for {
			lc, err := ln.Accept()
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			go func() {
				defer lc.Close()
				rc, err := c.DialPort(ctx, ref, rport)
				if err != nil {
					fmt.Fprintf(os.Stderr, "clade: port-forward: %v\n", err)
					return
				}
				defer rc.Close()
				pipe(lc, rc)
			}()
		}
	})
	return cmd
}

// pipe copies a to b and b to a, passing each direction's end on as a
// half-close, until both have ended (or one failed).
func pipe(a, b net.Conn) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		copyHalf(b, a)
	}()
	copyHalf(a, b)
	<-done
}

func copyHalf(dst, src net.Conn) {
	if _, err := io.Copy(dst, src); err != nil && !errors.Is(err, net.ErrClosed) {
		dst.Close()
		src.Close()
		return
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	} else {
		dst.Close()
	}
}

func newCACmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ca [flags]",
		Short: "Print the CA certificate of the daemon's TLS ingress",
		Long: "Prints, as PEM, the certificate of the CA that `clade daemon --ingress-tls` made\n" +
			"(once, in its data dir) to sign its ingress certificate. Trust it to reach\n" +
			"sandboxes over https: NODE_EXTRA_CA_CERTS=FILE (Node, the E2B JS SDK),\n" +
			"SSL_CERT_FILE=FILE (Python; it replaces the system's CAs, so give a bundle\n" +
			"with them if other hosts are reached too), curl --cacert FILE. The CA can sign\n" +
			"only names under the ingress domain, localhost and loopback addresses.\n" +
			"It asks the daemon, or with --data-dir reads DIR/" + ingress.CACertFile + " itself (no daemon\n" +
			"needed).",
		Example: "  clade ca > clade-ca.pem && NODE_EXTRA_CA_CERTS=clade-ca.pem node app.mjs\n" +
			"  sudo clade ca --data-dir /var/lib/clade > clade-ca.pem\n" +
			"  curl --cacert clade-ca.pem https://8000-box.clade.localhost:8443/",
		Args: nargs(0, 0),
	}
	dataDir := cmd.Flags().String("data-dir", "", "read the CA from the daemon's data `dir` instead of asking the daemon")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if *dataDir != "" {
			b, err := ingress.ReadCACert(*dataDir)
			if errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("%s holds no ingress CA: the daemon makes it when started with --ingress-tls (and no --ingress-tls-cert)", *dataDir)
			}
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(b)
			return err
		}
		return withClient(func(ctx context.Context, c *sdk.Client, _ []string) error {
			b, err := c.IngressCA(ctx)
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(b)
			return err
		})(cmd, args)
	}
	return cmd
}
