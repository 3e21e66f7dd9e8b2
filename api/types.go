// Package api holds the types of clade's HTTP API, shared by the daemon and
// the Go SDK. api/openapi.yaml is the contract; a test keeps the two in step.
package api

import (
	"time"

	"github.com/clade-sandbox/clade/api/stream"
)

// Version is the API path prefix.
const Version = "v1"

// Sandbox is a sandbox as the API shows it.
type Sandbox struct {
	ID   string `json:"id"`
	Name string `json:"name,omitempty"`
	// Node names the node that holds the sandbox ("local" for a daemon
	// that is not part of a cluster).
	Node      string   `json:"node,omitempty"`
	Image     string   `json:"image"`
	State     string   `json:"state"`
	MemoryMiB int      `json:"memory_mib"`
	CPUs      float64  `json:"cpus"`
	Env       []string `json:"env,omitempty"`
	// Snapshot is the snapshot the sandbox was restored from (a fork's
	// child), if any.
	Snapshot string `json:"snapshot,omitempty"`
	// DiskMiB caps what the sandbox may write.
	DiskMiB int `json:"disk_mib,omitempty"`
	// Engine is the engine the sandbox runs in; empty: the daemon's default.
	Engine    string            `json:"engine,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	Error     string            `json:"error,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	// Network is the sandbox's network mode, egress policy and address.
	Network *Network `json:"network,omitempty"`
	// Public sandboxes' ports are served by the ingress without a traffic
	// token.
	Public bool `json:"public,omitempty"`
	// Ingress says how to reach the sandbox's ports through the daemon's
	// ingress; absent when the daemon serves none.
	Ingress *Ingress `json:"ingress,omitempty"`
	// IdleSleepMS: the sandbox sleeps after this long without an exec, a
	// file transfer or ingress/port-forward traffic.
	IdleSleepMS int64 `json:"idle_sleep_ms,omitempty"`
	// TimeoutMS is the sandbox's renewable lifetime, ExpiresAt when the
	// current one ends and OnTimeout ("rm", "sleep" or "sleep-files": asleep keeping the files only) what happens then.
	TimeoutMS int64      `json:"timeout_ms,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	OnTimeout string     `json:"on_timeout,omitempty"`
	// Volumes are the volumes the sandbox mounts.
	Volumes []VolumeMount `json:"volumes,omitempty"`
	// Secrets are the secrets the sandbox took and their versions (never
	// their values).
	Secrets []SecretRef `json:"secrets,omitempty"`
	// SleepImage, in a cluster, is the digest of a sleeping sandbox's
	// sleep image in the object store: when set, the sandbox can wake on
	// any node (see docs/cluster.md); empty, it wakes only on its own.
	SleepImage string `json:"sleep_image,omitempty"`
}

// Network is a sandbox's network: its mode, its egress policy and, while
// it runs with a network of its own, its address. It is also the body of
// PUT /v1/sandboxes/{id}/network, which replaces the policy (PATCH with a
// NetworkChange edits it).
type Network struct {
	// Mode is "internet" (an address of its own, egress under the policy)
	// or "none" (loopback only).
	Mode string `json:"mode,omitempty"`
	// Egress is "allow" or "deny": what happens to destinations no rule
	// names.
	Egress string `json:"egress,omitempty"`
	// Allow lists HOST, *.DOMAIN or IPv4 CIDR rules; any entry makes the
	// policy an allowlist. Deny lists IPv4 CIDRs that are always refused.
	Allow []string `json:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty"`
	// Address is the sandbox's own IPv4 address (read only).
	Address string `json:"address,omitempty"`
}

// NetworkChange is the body of PATCH /v1/sandboxes/{id}/network: rules to
// add to and remove from a sandbox's egress policy, the others kept.
// Rules compare in canonical form; removals apply first, and removing a
// rule the policy does not hold changes nothing. Egress, when given,
// replaces the policy's default; omitted, it stays (removing the last
// allow rule of an allowlist leaves nothing allowed).
type NetworkChange struct {
	Egress      string   `json:"egress,omitempty"`
	AddAllow    []string `json:"add_allow,omitempty"`
	RemoveAllow []string `json:"remove_allow,omitempty"`
	AddDeny     []string `json:"add_deny,omitempty"`
	RemoveDeny  []string `json:"remove_deny,omitempty"`
}

// Ingress is how a sandbox's ports are reached through the daemon's
// ingress proxy.
type Ingress struct {
	// URL is a template: replace {port} with a port inside the sandbox.
	URL string `json:"url"`
	// TokenHeader is the request header that must carry TrafficToken,
	// unless the sandbox is public.
	TokenHeader  string `json:"token_header"`
	TrafficToken string `json:"traffic_token,omitempty"`
	// HostMask, when set, is the Host header the sandbox's servers are
	// sent on ingress requests instead of the client's, ${PORT} replaced
	// by the port (E2B's maskRequestHost).
	HostMask string `json:"host_mask,omitempty"`
}

// IngressCA is the answer of GET /v1/ingress/ca: the certificate of the
// daemon's own CA, which signed the ingress's TLS certificate.
type IngressCA struct {
	PEM string `json:"pem"`
}

// SignedURLRequest is the body of POST /v1/sandboxes/{id}/ports/{port}/url.
type SignedURLRequest struct {
	// TTLMS is how long the URL is valid; 0 means one hour. At most 30
	// days.
	TTLMS int64 `json:"ttl_ms,omitempty"`
}

// SignedURL is a URL of one port of a sandbox through the ingress that
// needs no traffic token until ExpiresAt.
type SignedURL struct {
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
}

// SleepRequest is the optional body of POST /v1/sandboxes/{id}/sleep.
type SleepRequest struct {
	// Memory false keeps the sandbox's files but not its processes: its
	// wake starts it afresh on its files (E2B's pause with memory: false).
	// Absent or true: the sandbox wakes as it slept, processes and all.
	Memory *bool `json:"memory,omitempty"`
}

// WakeRequest is the optional body of POST /v1/sandboxes/{id}/wake.
type WakeRequest struct {
	// Node, in a cluster, is the node to wake the sandbox on: a sandbox
	// asleep on another node is moved there first (its sleep image from
	// the object store). Empty: its own node, or the one placement picks
	// when its own cannot.
	Node string `json:"node,omitempty"`
}

// TimeoutRequest is the body of POST /v1/sandboxes/{id}/timeout.
type TimeoutRequest struct {
	// TimeoutMS is the new lifetime from now; 0 removes the timeout.
	TimeoutMS int64 `json:"timeout_ms"`
	// OnTimeout ("rm", "sleep" or "sleep-files": asleep keeping the files only) replaces what happens at the timeout;
	// empty keeps it (or, for a new timeout, means rm).
	OnTimeout string `json:"on_timeout,omitempty"`
}

// CreateSandboxRequest is the body of POST /v1/sandboxes.
type CreateSandboxRequest struct {
	Name      string   `json:"name,omitempty"`
	Image     string   `json:"image,omitempty"`
	MemoryMiB int      `json:"memory_mib,omitempty"`
	CPUs      float64  `json:"cpus,omitempty"`
	Env       []string `json:"env,omitempty"`
	// DiskMiB caps what the sandbox may write (its files); writes past it
	// fail with ENOSPC inside. 0 takes the daemon's default.
	DiskMiB int `json:"disk_mib,omitempty"`
	// Engine names the engine to run the sandbox in (e.g. gvisor, qemu);
	// empty means the daemon's default.
	Engine string `json:"engine,omitempty"`
	// Labels are key=value pairs to find sandboxes by.
	Labels map[string]string `json:"labels,omitempty"`
	// FromSnapshot restores the new sandbox from a snapshot (id or name)
	// instead of booting the image: a fork of one child.
	FromSnapshot string `json:"from_snapshot,omitempty"`
	// Network sets the network mode and egress policy; omitted, the
	// daemon's default mode with egress allow.
	Network *Network `json:"network,omitempty"`
	// Public lets the ingress serve the sandbox's ports without its
	// traffic token.
	Public bool `json:"public,omitempty"`
	// HostMask, when set, is the Host header the ingress sends the
	// sandbox's servers instead of the client's, ${PORT} standing for the
	// port (E2B's maskRequestHost), e.g. localhost:${PORT}.
	HostMask string `json:"host_mask,omitempty"`
	// IdleSleepMS puts the sandbox to sleep after this long without an
	// exec, a file transfer or ingress/port-forward traffic (0: never);
	// the next request wakes it.
	IdleSleepMS int64 `json:"idle_sleep_ms,omitempty"`
	// TimeoutMS ends the sandbox's life this long after its creation
	// (renewable: POST /v1/sandboxes/{id}/timeout); OnTimeout says how:
	// "rm" (the default) removes it, "sleep" puts it to sleep, "sleep-files" puts
	// it to sleep keeping its files only (the wake starts it afresh).
	TimeoutMS int64  `json:"timeout_ms,omitempty"`
	OnTimeout string `json:"on_timeout,omitempty"`
	// Volumes are named volumes to mount (see VolumeMount).
	Volumes []VolumeMount `json:"volumes,omitempty"`
	// Secrets are secrets the sandbox takes (see SecretRef).
	Secrets []SecretRef `json:"secrets,omitempty"`
	// Node, in a cluster, is the node to create the sandbox on; empty,
	// placement picks one (the node with the most memory free after
	// admission that runs the engine and has the image).
	Node string `json:"node,omitempty"`
}

// Snapshot is a sandbox's state frozen on disk: memory, processes, files.
type Snapshot struct {
	ID   string `json:"id"`
	Name string `json:"name,omitempty"`
	// Node names the node that holds the snapshot's files.
	Node      string    `json:"node,omitempty"`
	Sandbox   string    `json:"sandbox"`
	Image     string    `json:"image"`
	MemoryMiB int       `json:"memory_mib"`
	CPUs      float64   `json:"cpus"`
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
	// Implicit snapshots are made by a fork of a sandbox; they are removed
	// with their last child.
	Implicit bool `json:"implicit,omitempty"`
	// UsedBy lists the sandboxes restored from the snapshot.
	UsedBy []string `json:"used_by,omitempty"`
}

// SnapshotRequest is the body of POST /v1/sandboxes/{id}/snapshot.
type SnapshotRequest struct {
	Name string `json:"name,omitempty"`
}

// ForkRequest is the body of POST /v1/fork.
type ForkRequest struct {
	// Source is a snapshot or a running sandbox (id or name); a sandbox is
	// snapshotted first and keeps running.
	Source string `json:"source"`
	N      int    `json:"n"`
	// Spread, in a cluster, places the children across the nodes (by
	// memory free after admission) instead of on the source's node.
	Spread bool `json:"spread,omitempty"`
}

// ForkChild is the outcome for one child of a fork.
type ForkChild struct {
	ID string `json:"id,omitempty"`
	// Node, in a cluster, is the node that holds the child (or refused it).
	Node  string `json:"node,omitempty"`
	Error string `json:"error,omitempty"`
	Code  string `json:"code,omitempty"`
}

// ForkResult answers a fork: one entry per child, in order.
type ForkResult struct {
	Snapshot string      `json:"snapshot"`
	Children []ForkChild `json:"children"`
}

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec.
type ExecRequest struct {
	Cmd       []string `json:"cmd"`
	Env       []string `json:"env,omitempty"`
	Workdir   string   `json:"workdir,omitempty"`
	TimeoutMS int64    `json:"timeout_ms,omitempty"`
	// Stdin must be set, with an `Upgrade: clade-stream` request, to send
	// stdin frames.
	Stdin bool `json:"stdin,omitempty"`
	// TTY runs the command on a pseudo-terminal: its output (stdout and
	// stderr merged) comes as stdout frames, stdin frames are what is
	// typed (0x03 interrupts), and resize frames change its size. Rows and
	// Cols are its first size (both 0: 24x80).
	TTY  bool   `json:"tty,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
	// User runs the command as that user of the sandbox: a name or
	// UID[:GID] (also name:group) from its /etc/passwd and /etc/group, with
	// the user's groups, HOME, USER, LOGNAME and SHELL, in the user's home
	// unless Workdir is set. Empty: the image's user (root by default).
	User string `json:"user,omitempty"`
	// Keep makes the command outlive the call that started it (not with
	// TTY): when the caller goes away, or the sandbox sleeps and wakes
	// with its memory, it runs on, its newest output (256 KiB) and its
	// exit kept inside the sandbox until someone attaches to it by pid.
	// Tag is the caller's label for it (at most 16 KiB), listed with it.
	// A sandbox made by an older clade runs it as an ordinary command.
	// Served to the daemon's own fronts (E2B) and, between a cluster's
	// nodes, on the peer-only /v1/internal/ routes (cluster token): the
	// public exec refuses it (400).
	Keep bool   `json:"keep,omitempty"`
	Tag  string `json:"tag,omitempty"`
}

// KeptCommand is a command started with ExecRequest.Keep that its
// sandbox still holds: running, or ended with its exit not yet collected
// by an attach.
type KeptCommand struct {
	PID int      `json:"pid"`
	Cmd []string `json:"cmd"`
	Tag string   `json:"tag,omitempty"`
	// Started is when it started, by the sandbox's clock.
	Started time.Time `json:"started"`
	// Stdin: its stdin is open (an attach may write to it).
	Stdin bool `json:"stdin,omitempty"`
	// Exit is set once it ended.
	Exit *ExitStatus `json:"exit,omitempty"`
	// Attached: a caller follows it now.
	Attached bool `json:"attached,omitempty"`
}

// Started is the payload of an exec stream's Started frame: the
// command's pid inside the sandbox, sent before any output of a command
// that started.
type Started struct {
	PID int `json:"pid"`
}

// ExitStatus ends an exec stream (the payload of its exit frame).
type ExitStatus struct {
	Code     int    `json:"code"`
	Signal   int    `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	Error    string `json:"error,omitempty"`
	// ErrorClass is set with Error, e.g. "not_found" for a missing command.
	ErrorClass string `json:"error_class,omitempty"`
}

// Image is a root filesystem sandboxes boot from.
type Image struct {
	Name string `json:"name"`
	// Ref is the reference the image was pulled or imported as (e.g.
	// python:3.12-slim); it names the image wherever a name does.
	Ref       string    `json:"ref,omitempty"`
	Source    string    `json:"source"`
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
	// Set for images pulled or imported from OCI and Docker images.
	Platform       string       `json:"platform,omitempty"`
	ManifestDigest string       `json:"manifest_digest,omitempty"`
	Layers         []string     `json:"layers,omitempty"`
	Config         *ImageConfig `json:"config,omitempty"`
	// UsedBy lists the sandboxes and snapshots made from the image.
	UsedBy []string `json:"used_by,omitempty"`
	// Snapshot, for a template, is the ready snapshot creates restore.
	Snapshot string `json:"snapshot,omitempty"`
}

// ImageConfig is how an image's processes run: Env is every sandbox's base
// environment, WorkingDir and User the defaults of every exec.
type ImageConfig struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
}

// PullImageRequest is the body of POST /v1/images/pull.
type PullImageRequest struct {
	Ref      string `json:"ref"`
	Name     string `json:"name,omitempty"`
	Platform string `json:"platform,omitempty"`
	// Insecure allows plain HTTP to the registry.
	Insecure bool `json:"insecure,omitempty"`
}

// BuildSandboxRequest is the body of POST /v1/builds: the sandbox an image
// build runs its steps in.
type BuildSandboxRequest struct {
	// From is the base image: a name or a reference.
	From string   `json:"from"`
	Env  []string `json:"env,omitempty"`
}

// BuildEvent is the one line of the application/x-ndjson answer of POST
// /v1/builds: the build's sandbox, or the error. The answer then stays
// open; when the client closes it (or goes away) the daemon removes the
// sandbox.
type BuildEvent struct {
	Sandbox *Sandbox `json:"sandbox,omitempty"`
	Error   *Error   `json:"error,omitempty"`
}

// ImageProgress is one line of a pull or import's progress stream.
type ImageProgress struct {
	Layer       string `json:"layer,omitempty"`
	LayersDone  int    `json:"layers_done"`
	LayersTotal int    `json:"layers_total"`
	BytesDone   int64  `json:"bytes_done"`
	BytesTotal  int64  `json:"bytes_total"`
	Cached      int    `json:"cached"`
}

// ImageEvent is one line of the application/x-ndjson answer of a pull or
// import: progress lines, then one line with the image or the error.
type ImageEvent struct {
	Progress *ImageProgress `json:"progress,omitempty"`
	Image    *Image         `json:"image,omitempty"`
	Error    *Error         `json:"error,omitempty"`
}

// Health is the body of GET /v1/health.
type Health struct {
	Version string `json:"version"`
	Engine  string `json:"engine"`
	// EngineVersion is the engine's version, when it tells one.
	EngineVersion string `json:"engine_version,omitempty"`
	// Warm counts prepared sandboxes waiting in the warm pool.
	Warm int `json:"warm"`
	// Hot counts started sandboxes waiting in the hot pool.
	Hot int `json:"hot"`
	// Engines lists the engines this daemon has: those it runs (the
	// default first) and those this host lacks, with what is missing.
	Engines []EngineStatus `json:"engines,omitempty"`
}

// EngineStatus is one engine of GET /v1/health.
type EngineStatus struct {
	Name      string `json:"name"`
	Default   bool   `json:"default,omitempty"`
	Available bool   `json:"available"`
	// Reason says, for an engine that is not available, what is missing
	// and how to install it.
	Reason string `json:"reason,omitempty"`
}

// Error is the body of every 4xx and 5xx answer.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// StreamContentType is the media type of exec streams: frames of package
// api/stream.
const StreamContentType = stream.ContentType

// UpgradeProtocol is the Upgrade token for a two-way exec stream.
const UpgradeProtocol = stream.UpgradeProtocol

// TCPUpgradeProtocol is the Upgrade token of GET
// /v1/sandboxes/{id}/ports/{port}: after 101 the connection carries the raw
// bytes of a TCP connection to that port inside the sandbox.
const TCPUpgradeProtocol = "clade-tcp"

// CommitRequest is the body of POST /v1/sandboxes/{id}/commit: the
// sandbox's filesystem becomes an image (the last step of an image build).
type CommitRequest struct {
	Name    string   `json:"name"`
	Env     []string `json:"env,omitempty"`
	Workdir string   `json:"workdir,omitempty"`
	// Start makes the image a template: it runs in a sandbox of the new
	// image until Ready exits 0 (or something listens on TCP when Ready
	// is empty), and that sandbox's snapshot is what creates restore.
	Start string `json:"start,omitempty"`
	Ready string `json:"ready,omitempty"`
	// ReadyTimeoutMS bounds the wait for readiness (default 60 s).
	ReadyTimeoutMS int64 `json:"ready_timeout_ms,omitempty"`
	// Volumes, with Start, are mounted in the template's sandbox; its
	// snapshot records their content, and each sandbox of the template
	// gets its own copy (shared ones are mounted by all).
	Volumes []VolumeMount `json:"volumes,omitempty"`
}

// Event is one line of GET /v1/events: something that happened to a
// sandbox. Type is one of the EventXxx constants (clients ignore types
// they do not know); fields that do not apply are absent. A line with
// only Error set ends a stream the daemon cut off.
type Event struct {
	// Seq increases by one per event, across daemon restarts too; resume
	// a stream with ?since= the last Seq received.
	Seq  uint64    `json:"seq,omitempty"`
	Time time.Time `json:"time,omitempty,omitzero"`
	Type string    `json:"type,omitempty"`
	// Node, in a cluster, is the node the event happened on.
	Node string `json:"node,omitempty"`
	// Sandbox is the sandbox's id; Name and Labels are as they were then.
	Sandbox string            `json:"sandbox,omitempty"`
	Name    string            `json:"name,omitempty"`
	Labels  map[string]string `json:"labels,omitempty"`
	// Snapshot: the snapshot taken (snapshotted), forked from (forked), or
	// restored from (created and started of a fork's child).
	Snapshot string `json:"snapshot,omitempty"`
	// Children are the sandboxes a fork made; Failed counts its failed
	// children.
	Children []string `json:"children,omitempty"`
	Failed   int      `json:"failed,omitempty"`
	// Reason says why (stopped, admission.refused).
	Reason string     `json:"reason,omitempty"`
	Exec   *EventExec `json:"exec,omitempty"`
	Error  *Error     `json:"error,omitempty"`
}

// EventExec is the command of an exec.started or exec.ended event.
type EventExec struct {
	Cmd []string `json:"cmd"`
	TTY bool     `json:"tty,omitempty"`
	PID int      `json:"pid,omitempty"`
	// Code (exec.ended) is the exit status: 128+signal for a signalled
	// command, -1 when it never ran or was lost (see Error).
	Code     int    `json:"code"`
	Signal   int    `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	Error    string `json:"error,omitempty"`
}

// EventsStartHeader, in a followed GET /v1/events answer, is the seq of
// the last event before the stream's live part: a client that lost the
// stream before receiving any event resumes with since= this.
const EventsStartHeader = "Clade-Events-Start"

// Event types.
const (
	EventCreated          = "created"
	EventStarted          = "started"
	EventExecStarted      = "exec.started"
	EventExecEnded        = "exec.ended"
	EventSnapshotted      = "snapshotted"
	EventForked           = "forked"
	EventSlept            = "slept"
	EventWoken            = "woken"
	EventStopped          = "stopped"
	EventRemoved          = "removed"
	EventAdmissionRefused = "admission.refused"
	// EventLost (a cluster): a sandbox's record was marked lost because
	// its node left the cluster (its lease lapsed) while it was not
	// asleep; Reason says so. It comes once, from the node that marked
	// it (Node), not from the node that held it.
	EventLost = "lost"
	// A merged stream's (GET /v1/events?cluster=true) own: a node's part
	// begins (a node that joined, or answered again, after the stream
	// began; Reason says from where) or ends (its lease lapsed, it left,
	// or it stopped answering; Reason says which). Neither has a Seq.
	EventNodeJoined = "node.joined"
	EventNodeLeft   = "node.left"
)

// SandboxStats is one reading of a sandbox's resource use: the body of GET
// /v1/sandboxes/{id}/stats and the items of GET /v1/stats. Only a running
// sandbox has use to read; for the others only the identity and state are
// set.
type SandboxStats struct {
	ID    string `json:"id"`
	Name  string `json:"name,omitempty"`
	State string `json:"state"`
	// ReadAt is when the daemon took the reading.
	ReadAt time.Time `json:"read_at"`
	// CPUNanos is the CPU time used since the sandbox (re)started, in
	// nanoseconds; a rate is the difference of two readings over the
	// difference of their ReadAt. CPUs is the sandbox's CPU limit in cores.
	CPUNanos uint64  `json:"cpu_ns"`
	CPUs     float64 `json:"cpus"`
	// MemoryBytes is what the sandbox costs the host's memory now (its
	// cgroup, less page cache the kernel can drop at once); MemoryLimitBytes
	// is its cap.
	MemoryBytes      uint64 `json:"memory_bytes"`
	MemoryLimitBytes uint64 `json:"memory_limit_bytes"`
	// Pids counts the processes running inside the sandbox.
	Pids int `json:"pids"`
	// Node, in a cluster, is the node that holds the sandbox; Error says
	// why there is no reading of it (its node did not answer in time).
	Node  string `json:"node,omitempty"`
	Error string `json:"error,omitempty"`
}
