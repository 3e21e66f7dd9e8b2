package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/clade-sandbox/clade/internal/front/httpapi"
	cmcp "github.com/clade-sandbox/clade/internal/front/mcp"
	"github.com/clade-sandbox/clade/sdk"
)

func newMCPCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mcp [flags]",
		Short: "Serve AI agents over the Model Context Protocol",
		Long: "Serves clade to AI agents as a Model Context Protocol server: on stdin and\n" +
			"stdout by default (what desktop agents start), or as streamable HTTP on ADDR\n" +
			"at path /mcp. Over HTTP every request must carry the token, if one is set,\n" +
			"as `Authorization: Bearer TOKEN`; the token is --token-file's, else\n" +
			"$CLADE_TOKEN (the daemon's). Without a token --http listens on loopback only.",
		Example: "  clade mcp\n  clade mcp --http 127.0.0.1:7071",
		Args:    nargs(0, 0),
	}
	fs := cmd.Flags()
	httpAddr := fs.String("http", "", "serve streamable HTTP on ADDR (e.g. 127.0.0.1:7071) instead of stdio")
	tokenFile := fs.String("token-file", "", "file holding the bearer token HTTP clients must send (default $CLADE_TOKEN)")
	maxOutput := fs.Int("max-output", 32<<10, "bytes of a command's stdout and of its stderr a tool result carries; longer output is cut in the middle")
	level := fs.String("log-level", "warn", "debug, info, warn or error (logs go to stderr)")
	cmd.RunE = withClient(func(ctx context.Context, c *sdk.Client, args []string) error {
		var lvl slog.Level
		if err := lvl.UnmarshalText([]byte(*level)); err != nil {
			return badArg("bad --log-level %q: give debug, info, warn or error", *level)
		}
		log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
		srv := cmcp.New(cmcp.Config{Client: c, Version: versionString(), MaxOutput: *maxOutput, Log: log})
		if *httpAddr == "" {
			if *tokenFile != "" {
				return badArg("--token-file is for --http: over stdio the agent that starts clade mcp is the only client")
			}
			err := srv.Run(ctx, cmcp.StdioTransport(ctx, os.Stdin, os.Stdout))
			if ctx.Err() != nil || errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		}
		token := os.Getenv("CLADE_TOKEN")
		if *tokenFile != "" {
			b, err := os.ReadFile(*tokenFile)
			if err != nil {
				return fmt.Errorf("token file: %w", err)
			}
			if token = strings.TrimSpace(string(b)); token == "" {
				return fmt.Errorf("token file %s is empty", *tokenFile)
			}
		}
		ln, err := net.Listen("tcp", *httpAddr)
		if err != nil {
			return err
		}
		if token == "" && !loopback(ln.Addr()) {
			ln.Close()
			return fmt.Errorf("--http %s is reachable from other machines: set a token with --token-file (or CLADE_TOKEN), or listen on 127.0.0.1", *httpAddr)
		}
		var h http.Handler = mcpsdk.NewStreamableHTTPHandler(func(*http.Request) *mcpsdk.Server { return srv },
			&mcpsdk.StreamableHTTPOptions{Logger: log, SessionTimeout: 30 * time.Minute})
		if token != "" {
			h = httpapi.RequireToken(token, h)
		}
		mux := http.NewServeMux()
		mux.Handle("/mcp", h)
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		// Tests and scripts read the address from here (ADDR may end in :0).
		fmt.Fprintf(os.Stderr, "clade mcp: serving MCP on http://%s/mcp\n", ln.Addr())
		errc := make(chan error, 1)
		go func() { errc <- hs.Serve(ln) }()
		select {
		case err := <-errc:
			return err
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = hs.Shutdown(sctx)
			return nil
		}
	})
	return cmd
}

func loopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}
