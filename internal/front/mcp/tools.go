package mcp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/clade-sandbox/clade/sdk"
)

// Sandbox is a sandbox as the tools show it: what a model needs to decide
// what to do next, without the daemon's internals.
type Sandbox struct {
	ID        string            `json:"id" jsonschema:"the sandbox id (16 hex digits); pass it as 'sandbox' to the other tools"`
	Name      string            `json:"name,omitempty" jsonschema:"the sandbox's unique name, usable wherever an id is"`
	Image     string            `json:"image" jsonschema:"the image it was booted from"`
	State     string            `json:"state" jsonschema:"running, sleeping (memory freed, everything kept; any use wakes it), creating, suspending, waking, stopped (dead: remove it) or destroying"`
	MemoryMiB int               `json:"memory_mib" jsonschema:"memory limit in MiB"`
	CPUs      float64           `json:"cpus" jsonschema:"CPU limit in cores"`
	Labels    map[string]string `json:"labels,omitempty"`
	Network   string            `json:"network,omitempty" jsonschema:"network mode: internet or none"`
	Address   string            `json:"address,omitempty" jsonschema:"the sandbox's own IPv4 address, when it has one"`
	CreatedAt string            `json:"created_at" jsonschema:"creation time, RFC 3339"`
	Error     string            `json:"error,omitempty" jsonschema:"what went wrong last, if anything"`
	Node      string            `json:"node,omitempty" jsonschema:"the node of the cluster that holds it (a daemon of a cluster only); every tool works on it from any node"`
}

func toSandbox(sb sdk.Sandbox) Sandbox {
	out := Sandbox{ID: sb.ID, Name: sb.Name, Image: sb.Image, State: sb.State, MemoryMiB: sb.MemoryMiB, CPUs: sb.CPUs,
		Labels: sb.Labels, CreatedAt: sb.CreatedAt.UTC().Format(time.RFC3339), Error: sb.Error, Node: sb.Node}
	if n := sb.Network; n != nil {
		out.Network, out.Address = n.Mode, n.Address
	}
	return out
}

// SandboxRef is the input of tools that act on one sandbox.
type SandboxRef struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's id or name"`
}

type CreateInput struct {
	Image     string            `json:"image,omitempty" jsonschema:"image to boot: a name or the reference it was pulled as; omit for the default image (Debian with python3)"`
	Name      string            `json:"name,omitempty" jsonschema:"a unique name to refer to the sandbox by instead of its id"`
	MemoryMiB int               `json:"memory_mib,omitempty" jsonschema:"memory limit in MiB; omit for the daemon's default (512)"`
	CPUs      float64           `json:"cpus,omitempty" jsonschema:"CPU limit in cores; omit for the default (1)"`
	Env       []string          `json:"env,omitempty" jsonschema:"environment variables KEY=VALUE for every command in the sandbox"`
	Labels    map[string]string `json:"labels,omitempty" jsonschema:"labels to find the sandbox by with list_sandboxes"`
	Network   string            `json:"network,omitempty" jsonschema:"'internet' (own address, outbound traffic allowed) or 'none' (loopback only); omit for the daemon's default"`
	// Seconds rather than durations: models count in numbers.
	IdleSleepSeconds int `json:"idle_sleep_seconds,omitempty" jsonschema:"put the sandbox to sleep after this many seconds without use (0: never)"`
	TimeoutSeconds   int `json:"timeout_seconds,omitempty" jsonschema:"remove the sandbox this many seconds after creation (0: never)"`
}

type RunInput struct {
	Sandbox        string   `json:"sandbox" jsonschema:"the sandbox's id or name"`
	Command        string   `json:"command,omitempty" jsonschema:"a shell command line, run with /bin/sh -c (pipes, redirections, && work); give this or args"`
	Args           []string `json:"args,omitempty" jsonschema:"the program and its arguments, run without a shell; give this or command"`
	Workdir        string   `json:"workdir,omitempty" jsonschema:"absolute working directory; default /, or the user's home"`
	User           string   `json:"user,omitempty" jsonschema:"run as this user of the sandbox, a name or UID[:GID], with its groups, HOME and login environment; default the image's user (root)"`
	Env            []string `json:"env,omitempty" jsonschema:"extra environment variables KEY=VALUE"`
	Stdin          string   `json:"stdin,omitempty" jsonschema:"text fed to the command's standard input"`
	TimeoutSeconds int      `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this many seconds; default 120, at most 3600"`
}

type RunOutput struct {
	ExitCode int    `json:"exit_code" jsonschema:"the command's exit code: 0 is success; 128+N when killed by signal N; 124 on timeout; 127 when the program is not found"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	TimedOut bool   `json:"timed_out,omitempty"`
	Error    string `json:"error,omitempty" jsonschema:"why the command could not run, e.g. the program was not found"`
	// Truncated says how much of the output was cut, if any.
	Truncated string `json:"truncated,omitempty" jsonschema:"set when long output was cut in the middle, saying how much"`
}

type ListInput struct {
	Labels map[string]string `json:"labels,omitempty" jsonschema:"only sandboxes with every one of these labels"`
}

type ListOutput struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

type SnapshotInput struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's id or name; it must be running and keeps running"`
	Name    string `json:"name,omitempty" jsonschema:"a unique name for the snapshot"`
}

type SnapshotOutput struct {
	ID        string `json:"id" jsonschema:"the snapshot id; give it (or its name) as fork's source"`
	Name      string `json:"name,omitempty"`
	Sandbox   string `json:"sandbox" jsonschema:"the sandbox it was taken of"`
	SizeBytes int64  `json:"size_bytes"`
}

type ForkInput struct {
	Source string `json:"source" jsonschema:"a running sandbox (snapshotted first; it keeps running) or a snapshot, by id or name"`
	N      int    `json:"n" jsonschema:"how many children to make, 1 to 32"`
}

type ForkChild struct {
	ID    string `json:"id,omitempty" jsonschema:"the child's sandbox id, running and identical to the source"`
	Error string `json:"error,omitempty" jsonschema:"why this child could not be made"`
}

type ForkOutput struct {
	Snapshot string      `json:"snapshot" jsonschema:"the snapshot the children were restored from"`
	Children []ForkChild `json:"children"`
}

type RemoveOutput struct {
	Removed string `json:"removed"`
}

type StatsOutput struct {
	State            string  `json:"state"`
	CPUSeconds       float64 `json:"cpu_seconds" jsonschema:"CPU time used since the sandbox started"`
	MemoryBytes      uint64  `json:"memory_bytes"`
	MemoryLimitBytes uint64  `json:"memory_limit_bytes"`
	Processes        int     `json:"processes"`
}

func (t *tools) register(s *mcpsdk.Server) {
	log := t.cfg.Log
	t.registerCode(s)
	add(s, log, &mcpsdk.Tool{Name: "create_sandbox", Title: "Create a sandbox",
		Description: "Create a new isolated Linux sandbox and wait until it is ready (about a second). Returns its id, which the other tools take as 'sandbox'. The sandbox keeps running until remove_sandbox (or its timeout); remove sandboxes you no longer need.",
		Annotations: &mcpsdk.ToolAnnotations{DestructiveHint: boolPtr(false), OpenWorldHint: boolPtr(false)}}, t.create)
	add(s, log, &mcpsdk.Tool{Name: "run_command", Title: "Run a command in a sandbox",
		Description: fmt.Sprintf("Run a command in a sandbox and wait for it to finish. Returns its exit code, stdout and stderr. Output beyond %d bytes per stream is cut in the middle (the start and the end are kept) and 'truncated' says how much was cut: redirect big output to a file and read parts of it instead. Each call is a fresh process: use 'workdir' or 'cd DIR &&' rather than a separate cd. Background processes (cmd &) keep running after the call. A sleeping sandbox is woken first.", t.cfg.MaxOutput),
		Annotations: &mcpsdk.ToolAnnotations{DestructiveHint: boolPtr(true), OpenWorldHint: boolPtr(true)}}, t.run)
	add(s, log, &mcpsdk.Tool{Name: "read_file", Title: "Read a file from a sandbox",
		Description: fmt.Sprintf("Read a file in a sandbox. Text comes back as is; a binary file comes back base64-encoded (encoding says which). Files over %d bytes are cut, and 'truncated' says so: read parts of big files with run_command (head, tail, sed -n).", t.cfg.MaxFileBytes),
		Annotations: &mcpsdk.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: boolPtr(false)}}, t.readFile)
	add(s, log, &mcpsdk.Tool{Name: "write_file", Title: "Write a file in a sandbox",
		Description: "Create or replace a file in a sandbox with the given content; missing parent directories are created. For binary content pass it base64-encoded with encoding 'base64'.",
		Annotations: &mcpsdk.ToolAnnotations{DestructiveHint: boolPtr(true), IdempotentHint: true, OpenWorldHint: boolPtr(false)}}, t.writeFile)
	add(s, log, &mcpsdk.Tool{Name: "list_files", Title: "List a directory in a sandbox",
		Description: "List the entries of a directory in a sandbox with their type, size, mode and modification time; with 'depth' above 1 also the entries of subdirectories, that many levels down (paths are then relative to 'path').",
		Annotations: &mcpsdk.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: boolPtr(false)}}, t.listFiles)
	add(s, log, &mcpsdk.Tool{Name: "snapshot_sandbox", Title: "Snapshot a sandbox",
		Description: "Freeze a running sandbox's whole state (memory, running processes, files) into a snapshot; the sandbox keeps running. Give the snapshot to fork to start copies of that moment as often as you like.",
		Annotations: &mcpsdk.ToolAnnotations{DestructiveHint: boolPtr(false), OpenWorldHint: boolPtr(false)}}, t.snapshot)
	add(s, log, &mcpsdk.Tool{Name: "fork", Title: "Fork a sandbox into N copies",
		Description: "Make N new sandboxes that are exact copies (memory, running processes, files) of a running sandbox or of a snapshot, in one call. Each child has its own id and diverges from then on. Use it to try different approaches from the same state: run something different in each child, compare, keep the best child and remove_sandbox the others. Some children may fail while others succeed: each child has an id or an error.",
		Annotations: &mcpsdk.ToolAnnotations{DestructiveHint: boolPtr(false), OpenWorldHint: boolPtr(false)}}, t.fork)
	add(s, log, &mcpsdk.Tool{Name: "sleep_sandbox", Title: "Put a sandbox to sleep",
		Description: "Save a running sandbox to disk and free its memory. It keeps its id, files and running processes; wake_sandbox, run_command or any file tool brings it back where it was.",
		Annotations: &mcpsdk.ToolAnnotations{DestructiveHint: boolPtr(false), IdempotentHint: true, OpenWorldHint: boolPtr(false)}}, t.sleep)
	add(s, log, &mcpsdk.Tool{Name: "wake_sandbox", Title: "Wake a sleeping sandbox",
		Description: "Restore a sleeping sandbox in place: same id, files and processes. Waking a running sandbox does nothing.",
		Annotations: &mcpsdk.ToolAnnotations{DestructiveHint: boolPtr(false), IdempotentHint: true, OpenWorldHint: boolPtr(false)}}, t.wake)
	add(s, log, &mcpsdk.Tool{Name: "list_sandboxes", Title: "List sandboxes",
		Description: "List the sandboxes with their id, name, image, state and limits, optionally only those with given labels.",
		Annotations: &mcpsdk.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: boolPtr(false)}}, t.list)
	add(s, log, &mcpsdk.Tool{Name: "remove_sandbox", Title: "Remove a sandbox",
		Description: "Stop a sandbox and delete it with all its files and processes. This cannot be undone; snapshot_sandbox first to keep its state.",
		Annotations: &mcpsdk.ToolAnnotations{DestructiveHint: boolPtr(true), IdempotentHint: true, OpenWorldHint: boolPtr(false)}}, t.remove)
	add(s, log, &mcpsdk.Tool{Name: "sandbox_stats", Title: "Read a sandbox's resource use",
		Description: "Read a sandbox's CPU time, memory use against its limit and number of processes now. A sleeping sandbox uses nothing and is not woken.",
		Annotations: &mcpsdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: boolPtr(false)}}, t.stats)
	t.addResources(s)
}

func (t *tools) create(ctx context.Context, in CreateInput) (*mcpsdk.CallToolResult, Sandbox, error) {
	if in.IdleSleepSeconds < 0 || in.TimeoutSeconds < 0 {
		return nil, Sandbox{}, errors.New("idle_sleep_seconds and timeout_seconds must not be negative")
	}
	req := sdk.CreateSandboxRequest{Image: in.Image, Name: in.Name, MemoryMiB: in.MemoryMiB, CPUs: in.CPUs, Env: in.Env,
		Labels: in.Labels, IdleSleepMS: int64(in.IdleSleepSeconds) * 1000, TimeoutMS: int64(in.TimeoutSeconds) * 1000}
	if in.Network != "" {
		req.Network = &sdk.Network{Mode: in.Network}
	}
	sb, err := t.c.CreateSandbox(ctx, req)
	if err != nil {
		return nil, Sandbox{}, err
	}
	return nil, toSandbox(sb), nil
}

func (t *tools) run(ctx context.Context, in RunInput) (*mcpsdk.CallToolResult, RunOutput, error) {
	var cmd []string
	switch {
	case in.Command != "" && len(in.Args) > 0:
		return nil, RunOutput{}, errors.New("give either command (a shell line) or args (a program and its arguments), not both")
	case in.Command != "":
		cmd = []string{"/bin/sh", "-c", in.Command}
	case len(in.Args) > 0:
		cmd = in.Args
	default:
		return nil, RunOutput{}, errors.New("nothing to run: give command (a shell line, e.g. \"ls -l /\") or args")
	}
	timeout := in.TimeoutSeconds
	switch {
	case timeout == 0:
		timeout = 120
	case timeout < 0 || timeout > 3600:
		return nil, RunOutput{}, fmt.Errorf("timeout_seconds %d is out of range: give 1 to 3600", timeout)
	}
	stdout, stderr := newCapped(t.cfg.MaxOutput), newCapped(t.cfg.MaxOutput)
	req := sdk.ExecRequest{Cmd: cmd, Env: in.Env, Workdir: in.Workdir, User: in.User, Timeout: time.Duration(timeout) * time.Second,
		Stdout: stdout, Stderr: stderr}
	if in.Stdin != "" {
		req.Stdin = strings.NewReader(in.Stdin)
	}
	st, err := t.c.Exec(ctx, in.Sandbox, req)
	if err != nil {
		return nil, RunOutput{}, err
	}
	out := RunOutput{ExitCode: st.Code, Stdout: stdout.String(), Stderr: stderr.String(), TimedOut: st.TimedOut, Error: st.Error}
	if st.TimedOut {
		out.ExitCode = 124 // as the schema and `clade exec` say, not the kill's 137
	}
	var notes []string
	if n := stdout.cut(); n > 0 {
		notes = append(notes, fmt.Sprintf("%d bytes cut from the middle of stdout (%d in all)", n, stdout.total))
	}
	if n := stderr.cut(); n > 0 {
		notes = append(notes, fmt.Sprintf("%d bytes cut from the middle of stderr (%d in all)", n, stderr.total))
	}
	out.Truncated = strings.Join(notes, "; ")
	return &mcpsdk.CallToolResult{Content: []mcpsdk.Content{&mcpsdk.TextContent{Text: out.text(st)}}}, out, nil
}

// text is the result as a model reads it best: the exit first, then each
// stream under a header.
func (o RunOutput) text(st sdk.ExitStatus) string {
	var b strings.Builder
	fmt.Fprintf(&b, "exit code: %d", o.ExitCode)
	switch {
	case o.TimedOut:
		b.WriteString(" (timed out and killed)")
	case st.Signal != 0:
		fmt.Fprintf(&b, " (killed by signal %d)", st.Signal)
	}
	b.WriteString("\n")
	if o.Error != "" {
		b.WriteString("error: " + o.Error + "\n")
	}
	if o.Truncated != "" {
		b.WriteString("note: " + o.Truncated + "\n")
	}
	for _, s := range []struct{ name, text string }{{"stdout", o.Stdout}, {"stderr", o.Stderr}} {
		if s.text == "" {
			fmt.Fprintf(&b, "%s: (empty)\n", s.name)
			continue
		}
		fmt.Fprintf(&b, "%s:\n%s", s.name, s.text)
		if !strings.HasSuffix(s.text, "\n") {
			b.WriteString("\n")
		}
	}
	return b.String()
}

func (t *tools) list(ctx context.Context, in ListInput) (*mcpsdk.CallToolResult, ListOutput, error) {
	sbs, err := t.c.ListSandboxesLabeled(ctx, in.Labels)
	if err != nil {
		return nil, ListOutput{}, err
	}
	out := ListOutput{Sandboxes: []Sandbox{}}
	for _, sb := range sbs {
		out.Sandboxes = append(out.Sandboxes, toSandbox(sb))
	}
	return nil, out, nil
}

func (t *tools) snapshot(ctx context.Context, in SnapshotInput) (*mcpsdk.CallToolResult, SnapshotOutput, error) {
	snap, err := t.c.SnapshotSandbox(ctx, in.Sandbox, in.Name)
	if err != nil {
		return nil, SnapshotOutput{}, err
	}
	return nil, SnapshotOutput{ID: snap.ID, Name: snap.Name, Sandbox: snap.Sandbox, SizeBytes: snap.SizeBytes}, nil
}

// maxFork bounds one fork through MCP: a model asking for hundreds of
// copies is more likely a mistake than a plan.
const maxFork = 32

func (t *tools) fork(ctx context.Context, in ForkInput) (*mcpsdk.CallToolResult, ForkOutput, error) {
	if in.N < 1 || in.N > maxFork {
		return nil, ForkOutput{}, fmt.Errorf("n = %d: give 1 to %d children", in.N, maxFork)
	}
	res, err := t.c.Fork(ctx, in.Source, in.N)
	if err != nil {
		return nil, ForkOutput{}, err
	}
	out := ForkOutput{Snapshot: res.Snapshot, Children: []ForkChild{}}
	for _, c := range res.Children {
		out.Children = append(out.Children, ForkChild{ID: c.ID, Error: c.Error})
	}
	return nil, out, nil
}

func (t *tools) sleep(ctx context.Context, in SandboxRef) (*mcpsdk.CallToolResult, Sandbox, error) {
	sb, err := t.c.Sleep(ctx, in.Sandbox)
	if err != nil {
		return nil, Sandbox{}, err
	}
	return nil, toSandbox(sb), nil
}

func (t *tools) wake(ctx context.Context, in SandboxRef) (*mcpsdk.CallToolResult, Sandbox, error) {
	sb, err := t.c.Wake(ctx, in.Sandbox)
	if err != nil {
		return nil, Sandbox{}, err
	}
	return nil, toSandbox(sb), nil
}

func (t *tools) remove(ctx context.Context, in SandboxRef) (*mcpsdk.CallToolResult, RemoveOutput, error) {
	sb, err := t.c.GetSandbox(ctx, in.Sandbox)
	if err != nil {
		return nil, RemoveOutput{}, err
	}
	if err := t.c.DeleteSandbox(ctx, sb.ID); err != nil {
		return nil, RemoveOutput{}, err
	}
	return nil, RemoveOutput{Removed: sb.ID}, nil
}

func (t *tools) stats(ctx context.Context, in SandboxRef) (*mcpsdk.CallToolResult, StatsOutput, error) {
	st, err := t.c.Stats(ctx, in.Sandbox)
	if err != nil {
		return nil, StatsOutput{}, err
	}
	return nil, StatsOutput{State: st.State, CPUSeconds: float64(st.CPUNanos) / 1e9, MemoryBytes: st.MemoryBytes,
		MemoryLimitBytes: st.MemoryLimitBytes, Processes: st.Pids}, nil
}
