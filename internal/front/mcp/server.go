// Package mcp serves clade to AI agents as a Model Context Protocol server
// (https://modelcontextprotocol.io): tools to create sandboxes, run
// commands, move files, snapshot, fork, sleep, wake, list and remove, and
// resources for a sandbox's files. It is a client of the daemon like the
// CLI: everything goes through the Go SDK, so it runs wherever the CLI
// does (`clade mcp`), over stdio or streamable HTTP.
package mcp

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/clade-sandbox/clade/sdk"
)

// Config configures the server.
type Config struct {
	// Client is the daemon the tools act on.
	Client *sdk.Client
	// Version is reported to clients at initialization.
	Version string
	// MaxOutput caps the bytes of each of a command's stdout and stderr
	// that a tool result carries (the start and the end are kept, the
	// middle is cut with a note); 32 KiB when zero.
	MaxOutput int
	// MaxFileBytes caps what read_file and a file resource return; 256 KiB
	// when zero.
	MaxFileBytes int
	Log          *slog.Logger
}

// instructions tell a model what the server is for and how its tools fit
// together; clients show them to the model at the start of a session.
const instructions = `clade runs untrusted code in isolated gVisor sandboxes: small Linux machines (Debian by default) with their own files, processes and network.

Typical use: create_sandbox, then run_command and write_file/read_file/list_files in it, and remove_sandbox when done.
To explore alternatives from one state: snapshot_sandbox or fork (N copies of a running sandbox or snapshot, each with its own id); try something different in each child, keep the best, remove the others.
sleep_sandbox frees a sandbox's memory but keeps everything (files, running processes); any command, file access or wake_sandbox brings it back.
Sandboxes are named by id (16 hex digits) or by the name given at creation.`

// New returns the MCP server with every tool and the file resources.
func New(cfg Config) *mcpsdk.Server {
	if cfg.MaxOutput <= 0 {
		cfg.MaxOutput = 32 << 10
	}
	if cfg.MaxFileBytes <= 0 {
		cfg.MaxFileBytes = 256 << 10
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	s := mcpsdk.NewServer(&mcpsdk.Implementation{Name: "clade", Title: "clade sandboxes", Version: cfg.Version},
		&mcpsdk.ServerOptions{Instructions: instructions, Logger: cfg.Log})
	t := &tools{cfg: cfg, c: cfg.Client}
	t.register(s)
	return s
}

// tools holds what the tool handlers share.
type tools struct {
	cfg Config
	c   *sdk.Client
}

// add registers a typed tool whose handler never takes the server down: a
// panic becomes a tool error like any other.
func add[In, Out any](s *mcpsdk.Server, log *slog.Logger, tool *mcpsdk.Tool, h func(context.Context, In) (*mcpsdk.CallToolResult, Out, error)) {
	mcpsdk.AddTool(s, tool, func(ctx context.Context, _ *mcpsdk.CallToolRequest, in In) (res *mcpsdk.CallToolResult, out Out, err error) {
		defer func() {
			if v := recover(); v != nil {
				log.Error("mcp tool panic", "tool", tool.Name, "panic", v, "stack", string(debug.Stack()))
				var zero Out
				res, out, err = nil, zero, fmt.Errorf("internal error in %s: %v", tool.Name, v)
			}
		}()
		return h(ctx, in)
	})
}

func boolPtr(b bool) *bool { return &b }
