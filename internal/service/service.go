// Package service is the one interface every front (httpapi, e2b, ingress)
// drives a clade node through: sandboxes' lifecycle, exec, files, port
// dials, events, stats, images, volumes, secrets, network policy and
// health. It speaks the api types and errdefs errors only, so that a front
// cannot reach past it into the lifecycle service, the agent protocol, an
// engine or the store: service/local implements it over this process's
// sandbox.Manager, service/remote over the SDK (another node's daemon), and
// service/servicetest is the suite both pass.
//
// Wakes are explicit. A call that reads (Get, List, Stats, Running) never
// wakes a sleeping sandbox. A call that needs the sandbox's processes
// (Exec, the file calls, Dial) takes a Wake argument: service.Wake wakes a
// sleeping sandbox first (today's behaviour of every front), NoWake
// refuses one that is not running with a Conflict error.
package service

import (
	"context"
	"io"
	"net"
	"syscall"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/api/stream"
)

// Service is everything a front asks of a node.
type Service interface {
	Sandboxes
	Snapshots
	Exec
	Files
	Traffic
	Events
	Stats
	Images
	Builds
	Volumes
	Secrets
	Networks
	Health
}

// WakeMode says whether a call may wake a sleeping sandbox.
type WakeMode bool

const (
	// NoWake refuses a sandbox that is not running (Conflict).
	NoWake WakeMode = false
	// Wake wakes a sleeping sandbox first (one going to sleep is waited for).
	Wake WakeMode = true
)

// Sandboxes is the lifecycle of sandboxes.
type Sandboxes interface {
	// Create makes and starts a sandbox (from an image or a snapshot).
	Create(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error)
	// Get reads a sandbox by id or name; it never wakes it.
	Get(ctx context.Context, ref string) (api.Sandbox, error)
	// List reads every sandbox; it wakes none.
	List(ctx context.Context) ([]api.Sandbox, error)
	// Remove stops and removes a sandbox.
	Remove(ctx context.Context, ref string) error
	// RemoveAbandoned removes what a create or fork made for a client that
	// went away before the answer; the removal outlives ctx.
	RemoveAbandoned(ctx context.Context, why string, ids ...string)
	// Sleep seals a running sandbox's state and stops it.
	Sleep(ctx context.Context, ref string) (api.Sandbox, error)
	// SleepFiles is Sleep keeping the files but not the processes: the
	// wake starts the sandbox afresh on its files (E2B's pause with
	// memory: false).
	SleepFiles(ctx context.Context, ref string) (api.Sandbox, error)
	// Wake starts a sleeping sandbox again from its sealed state.
	Wake(ctx context.Context, ref string) (api.Sandbox, error)
	// SetTimeout sets (0: removes) a sandbox's timeout.
	SetTimeout(ctx context.Context, ref string, req api.TimeoutRequest) (api.Sandbox, error)
}

// Snapshots is snapshots and forks.
type Snapshots interface {
	// Snapshot takes a snapshot of a running sandbox.
	Snapshot(ctx context.Context, ref, name string) (api.Snapshot, error)
	// Fork makes n children of a snapshot or of a running sandbox. A
	// child that failed has Error and Code set.
	Fork(ctx context.Context, source string, n int) (api.ForkResult, error)
	// GetSnapshot reads a snapshot, with the sandboxes that use it.
	GetSnapshot(ctx context.Context, ref string) (api.Snapshot, error)
	// ListSnapshots reads every ready snapshot.
	ListSnapshots(ctx context.Context) ([]api.Snapshot, error)
	// RemoveSnapshot removes a snapshot no sandbox uses.
	RemoveSnapshot(ctx context.Context, ref string) error
}

// Exec runs processes in sandboxes.
type Exec interface {
	// Exec starts a process. The request is checked (argv, env, workdir,
	// timeout, terminal size) and refused with InvalidArgument; a process
	// that fails to start still starts a Process whose Wait says why.
	Exec(ctx context.Context, ref string, wake WakeMode, req api.ExecRequest) (Process, error)
	// SupportsUser reports whether the sandbox's agent runs an exec and
	// owns an upload as a named user (ExecRequest.User, CopyIn's user):
	// false for an agent of an older clade (inside an old snapshot), which
	// runs everything as root and refuses a request that names a user.
	SupportsUser(ctx context.Context, ref string, wake WakeMode) (bool, error)
	// Kept lists the sandbox's kept commands (ExecRequest.Keep), by pid.
	Kept(ctx context.Context, ref string, wake WakeMode) ([]api.KeptCommand, error)
	// Attach follows the kept command pid: its output kept while nobody
	// followed it, then the rest, then its exit (collected: a later
	// Attach is NotFound). Close detaches again. stdin makes Stdin write
	// to the command's stdin.
	Attach(ctx context.Context, ref string, wake WakeMode, pid int, stdin bool) (Process, error)
}

// Process is a process started by Exec. Stdout and Stderr must be read
// to their end (or the process closed).
type Process interface {
	// PID is the process's id inside the sandbox, or 0 when it did not
	// start (Wait says why). It may wait for the start to be known.
	PID() int
	// Stdin is nil unless the request set Stdin; closing it sends EOF.
	Stdin() io.WriteCloser
	Stdout() io.Reader
	Stderr() io.Reader
	Signal(sig syscall.Signal) error
	// Resize changes a TTY process's terminal size.
	Resize(rows, cols uint16) error
	// Wait returns how the process ended; the error is for a process
	// whose end is unknown (the sandbox went away).
	Wait(ctx context.Context) (api.ExitStatus, error)
	// Close kills the process if it still runs and frees what it holds.
	Close()
}

// Frames is what a Process may also be when its output already arrives
// as an exec stream (api/stream): a remote node's plain exec
// (service.Plain). NextFrame returns its stdout and stderr frames in the
// order they were sent, in the caller's goroutine, until an error (io.EOF
// at the exit; Wait then says how it ended). A front that relays them
// sends its client the same frames without the copies, pipes and
// goroutines of reading Stdout and Stderr apart. A process is read one
// way or the other: after the first NextFrame, Stdout and Stderr answer an
// error, and after Stdout or Stderr, NextFrame does.
type Frames interface {
	NextFrame() (stream.Frame, error)
}

// FileInfo describes a path inside a sandbox.
type FileInfo struct {
	IsDir bool
}

// Files moves files in and out of sandboxes. Paths are absolute, clean
// paths inside the sandbox (the fronts check them).
type Files interface {
	// Stat describes path (not following a final symlink); a missing
	// path is NotFound.
	Stat(ctx context.Context, ref string, wake WakeMode, path string) (FileInfo, error)
	// CopyOut streams path as a tar archive whose top entry is its base name.
	CopyOut(ctx context.Context, ref string, wake WakeMode, path string) (io.ReadCloser, error)
	// CopyIn extracts the tar archive r at path (docker cp semantics),
	// what it makes owned by user (a name or UID[:GID] of the sandbox;
	// "": root).
	CopyIn(ctx context.Context, ref string, wake WakeMode, path, user string, r io.Reader) error
	// Watch follows changes under the directory path (below it too with
	// recursive), by inotify inside the sandbox; it returns once the watch
	// is armed. A missing directory is NotFound.
	Watch(ctx context.Context, ref string, wake WakeMode, path string, recursive bool) (Watcher, error)
	// Xattrs reads the extended attributes named prefix+KEY (prefix in
	// the user. namespace, e.g. "user.e2b.") of each of paths, not
	// following a final symlink: one KEY -> value map per path, nil where
	// it has none or is missing. A sandbox whose agent keeps no
	// attributes (an older clade's) is InvalidArgument; with no paths,
	// Xattrs only checks that.
	Xattrs(ctx context.Context, ref string, wake WakeMode, prefix string, paths []string) ([]map[string]string, error)
	// SetXattrs replaces path's extended attributes named prefix+KEY with
	// attrs (KEY -> value; those not in it are removed), not following a
	// final symlink. A missing path is NotFound.
	SetXattrs(ctx context.Context, ref string, wake WakeMode, path, prefix string, attrs map[string]string) error
}

// ThroughWriter is what a node's Service adds (found by type assertion)
// when it can write files as a program of the user writes them, E2B's
// envd semantics rather than CopyIn's docker cp ones: WriteThrough writes
// the regular files of the tar archive r (each named by one path
// component) into the existing directory dir of the sandbox, through a
// symlink at a file's name, never replacing a directory (InvalidArgument),
// every file operation with user's credentials (a name or UID[:GID];
// "": root), so that no link leads a write where user may not write. A
// sandbox whose agent predates it (an older snapshot) gets CopyIn's
// extraction: callers keep their own checks for it.
type ThroughWriter interface {
	WriteThrough(ctx context.Context, ref string, wake WakeMode, dir, user string, r io.Reader) error
}

// WatchEvent is a change under a watched directory: Op is "create",
// "write", "remove", "rename" (an entry's old name; its new one is a
// create) or "chmod"; Name is relative to the directory, clean.
type WatchEvent struct {
	Op   string
	Name string
}

// Watcher is a running watch.
type Watcher interface {
	// Next waits for the next change; its error ends the watch (io.EOF:
	// ended without one).
	Next() (WatchEvent, error)
	// Close ends the watch.
	Close()
}

// Traffic is connections to sandboxes' ports.
type Traffic interface {
	// Dial connects to a TCP port inside the sandbox. The connection
	// half-closes (CloseWrite) when the implementation's can.
	Dial(ctx context.Context, ref string, wake WakeMode, port int) (net.Conn, error)
	// Ready waits until the sandbox's agent answers (waking it first with
	// Wake) and returns its life: a comparable value that is the same
	// until the sandbox starts again (a wake, a restart), so that a
	// connection kept from an earlier life is told apart. For a running
	// sandbox it is cheap (no store read).
	Ready(ctx context.Context, ref string, wake WakeMode) (life any, err error)
	// Hold marks a sandbox busy (no idle sleep) until release is called.
	Hold(id string) (release func())
	// Running reports, with no store read and no wake, whether the
	// sandbox id is known running (false when it cannot tell).
	Running(id string) bool
}

// EventFilter selects events: of one sandbox (id or name), and/or with
// every label given.
type EventFilter struct {
	Sandbox string
	Labels  map[string]string
}

// Events is the lifecycle event stream.
type Events interface {
	// EventsSince returns the kept events after seq since.
	EventsSince(ctx context.Context, since uint64, f EventFilter) ([]api.Event, error)
	// SubscribeEvents follows the events: the backlog after since (with
	// hasSince; else none), then each new one.
	SubscribeEvents(ctx context.Context, since uint64, hasSince bool, f EventFilter) (Subscription, error)
}

// Subscription is a followed event stream.
type Subscription interface {
	// Start is the seq the stream starts after.
	Start() uint64
	// Backlog is the events already kept, sent first.
	Backlog() []api.Event
	// C yields the new events.
	C() <-chan api.Event
	// Done is closed when the stream ends; Err says why.
	Done() <-chan struct{}
	Err() error
	Close()
}

type noPidsKey struct{}

// WithoutPids marks ctx for Stats readings that need no process count:
// their Pids may be 0 (a count costs the gVisor engine a process per
// sandbox and reading). For a caller that samples often (the E2B front's
// metrics history).
func WithoutPids(ctx context.Context) context.Context {
	return context.WithValue(ctx, noPidsKey{}, true)
}

// PidsWanted reports whether a Stats reading under ctx must count the
// sandbox's processes (no WithoutPids).
func PidsWanted(ctx context.Context) bool {
	no, _ := ctx.Value(noPidsKey{}).(bool)
	return !no
}

type noUsersKey struct{}

// WithoutUsers marks ctx for Image lookups that need only the image's
// record: their UsedBy may be empty. On a node the users are a store
// query, which waits for the store's writes (a create's) and holds them
// up; the record is read from memory. For a caller that looks an image up
// on each create (the E2B front, its base image's).
func WithoutUsers(ctx context.Context) context.Context {
	return context.WithValue(ctx, noUsersKey{}, true)
}

// UsersWanted reports whether an Image lookup under ctx must list the
// image's users (no WithoutUsers).
func UsersWanted(ctx context.Context) bool {
	no, _ := ctx.Value(noUsersKey{}).(bool)
	return !no
}

// Stats is resource use.
type Stats interface {
	// Stats reads a sandbox's use; it never wakes it nor counts as use. A
	// sandbox that is not running gets a reading with no use.
	Stats(ctx context.Context, ref string) (api.SandboxStats, error)
	// ListStats reads those named in refs, or, with none, every sandbox
	// with the labels.
	ListStats(ctx context.Context, refs []string, labels map[string]string) ([]api.SandboxStats, error)
}

// ImportImage is an image import's options.
type ImportImage struct {
	Name, Source string
}

// Images is the node's image store.
type Images interface {
	ListImages(ctx context.Context) ([]api.Image, error)
	// Image reads an image, with the sandboxes and snapshots that use it
	// (none under WithoutUsers).
	Image(ctx context.Context, ref string) (api.Image, error)
	RemoveImage(ctx context.Context, ref string) error
	PullImage(ctx context.Context, req api.PullImageRequest, progress func(api.ImageProgress)) (api.Image, error)
	// ImportImage imports the archive at path (a file of the caller's).
	ImportImage(ctx context.Context, path string, opts ImportImage, progress func(api.ImageProgress)) (api.Image, error)
	// CheckDisk refuses (Unavailable) when the node's disk is at its
	// floor: an upload checks it as it is read.
	CheckDisk(op string) error
}

// Builds is image builds: a build sandbox, committed.
type Builds interface {
	// CreateBuildSandbox starts a sandbox for a build; EndBuild removes it.
	CreateBuildSandbox(ctx context.Context, req api.BuildSandboxRequest) (api.Sandbox, error)
	EndBuild(ctx context.Context, id string) error
	// Commit makes an image (a template) of a sandbox.
	Commit(ctx context.Context, ref string, req api.CommitRequest) (api.Image, error)
}

// Volumes is named volumes. A node without volumes refuses every call
// with InvalidArgument.
type Volumes interface {
	CreateVolume(ctx context.Context, req api.CreateVolumeRequest) (api.Volume, error)
	ListVolumes(ctx context.Context) ([]api.Volume, error)
	GetVolume(ctx context.Context, ref string) (api.Volume, error)
	RemoveVolume(ctx context.Context, ref string) error
	// VolumeKey is an encrypted volume's key.
	VolumeKey(ctx context.Context, ref string) (string, error)
	// ExportVolume writes an encrypted volume's archive to w.
	ExportVolume(ctx context.Context, ref string, w io.Writer) error
	ImportVolume(ctx context.Context, name string, r io.Reader, key string) (api.Volume, error)
}

// Secrets is sealed secrets. A node without secrets refuses every call
// with InvalidArgument.
type Secrets interface {
	// SetSecret creates or replaces a secret; the caller clears value.
	SetSecret(ctx context.Context, name string, value []byte) (api.Secret, error)
	ListSecrets(ctx context.Context) ([]api.Secret, error)
	RemoveSecret(ctx context.Context, name string) error
}

// Networks is sandboxes' network policy.
type Networks interface {
	SetNetwork(ctx context.Context, ref string, n api.Network) (api.Sandbox, error)
	ChangeNetwork(ctx context.Context, ref string, ch api.NetworkChange) (api.Sandbox, error)
}

// Health is the node's health and engines.
type Health interface {
	Health(ctx context.Context) (api.Health, error)
}

// Nodes is what a node of a cluster adds to its Service (found by type
// assertion): the cluster's live nodes. A daemon outside a cluster's
// Service has no Nodes.
type Nodes interface {
	Nodes(ctx context.Context) ([]api.Node, error)
	// Drain (on) stops placing creates on the named live node, until
	// Drain (off); it answers the node as it is now.
	Drain(ctx context.Context, node string, on bool) (api.Node, error)
	// WakeOn wakes sleeping sandbox ref on the named node: moved there
	// first (its image from the object store) when it sleeps on another.
	WakeOn(ctx context.Context, ref, node string) (api.Sandbox, error)
}

// Mover is what a node's own Service adds (found by type assertion) for a
// cluster to move sleeping sandboxes between nodes through the snapshot
// store (--object-store).
type Mover interface {
	// SleepImage is the digest of the sealed copy in the snapshot store
	// of sleeping sandbox id's image: NotFound while there is none,
	// Conflict for a sandbox that cannot move (volumes, secrets).
	SleepImage(ctx context.Context, id string) (string, error)
	// Adopt makes sandbox id here, asleep, from its image in the
	// snapshot store (fetched by digest and verified): the cluster has
	// claimed it for this node. A sandbox the node has is answered as is.
	// The image root it stands on, if this node lacks it, is opened with
	// fetchRoot (a root stream from a node that holds it, by identity).
	Adopt(ctx context.Context, id, digest string, fetchRoot func(ctx context.Context, root string) (io.ReadCloser, error)) (api.Sandbox, error)
	// Disown removes the node's copy of sandbox id, which the cluster
	// gave to another node, keeping its copy in the snapshot store.
	Disown(ctx context.Context, id string) error
}

// Drainer is what a node's own Service adds (found by type assertion) for
// a drain of its node to move its running sandboxes: an idle one is put
// to sleep, then given away as a sleeping one is.
type Drainer interface {
	// SleepIdle puts running sandbox id to sleep when it is idle; busy
	// says why it stays for now ("" when it slept). A Conflict error: it
	// can never move so (no --object-store, volumes, secrets).
	SleepIdle(ctx context.Context, id string) (busy string, err error)
}
