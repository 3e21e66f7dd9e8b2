// Package engine declares what clade needs from an isolation backend. The
// sandbox manager drives engines only through this interface, and every engine
// passes the same conformance suite (package enginetest) against the real
// thing.
package engine

import (
	"context"

	"github.com/clade-sandbox/clade/internal/guest"
)

// Spec describes a sandbox to create.
type Spec struct {
	// ID is clade's fixed-length sandbox id; engines name their resources by it.
	ID string
	// Engine names the engine that runs the sandbox when a daemon serves
	// several (package multi); empty means the default one.
	Engine string
	// RootFS is the image's root directory on the host. Engines never write
	// to it: a sandbox's writes go to its own upper layer.
	RootFS string
	// Hostname seen inside the sandbox.
	Hostname string
	// MemoryMiB caps the sandbox's memory; CPUs caps its CPU time in cores.
	MemoryMiB int
	CPUs      float64
	// DiskMiB caps what the sandbox may write (its upper layer); writes past
	// it fail with ENOSPC inside. 0 means no cap.
	DiskMiB int
	// NetNS is the path of a network namespace the sandbox joins (its own
	// address and routes, set up by the network hook); empty means a
	// loopback-only network stack.
	NetNS string
	// DNS lists the nameservers the sandbox uses: the engine makes its
	// /etc/resolv.conf name them (a file it mounts over the image's).
	// Empty keeps the image's file.
	DNS []string
	// Env is the base environment of every process in the sandbox.
	Env []string
	// Workdir and User are the defaults of every exec (the image's
	// WorkingDir and User); empty means / and root.
	Workdir string
	User    string
	// Mounts are host directories (volumes) the sandbox sees at their
	// destinations. They are not part of a checkpoint: a restore may point
	// a destination at another directory (a fork child's own copy).
	Mounts []Mount
}

// Mount is a host directory bind-mounted into a sandbox, or (Type
// MountTmpfs) a small file system in the sandbox's memory.
type Mount struct {
	// Source is the host directory; Destination the absolute path inside.
	Source, Destination string
	ReadOnly            bool
	Type                string
}

// MountTmpfs is the Type of an in-memory mount (Source unused): what is
// written there never reaches the host's disk, except in checkpoints.
const MountTmpfs = "tmpfs"

// Sandbox is a live sandbox as an engine sees it.
type Sandbox interface {
	// ID returns the sandbox id.
	ID() string
	// Guest returns the connection to the sandbox's agent: the same Conn for
	// the sandbox's whole life in this engine (it survives the agent
	// reconnecting). The engine closes it when it lets go of the sandbox.
	Guest() *guest.Conn
	// PID returns the host pid of the sandbox's main process, or 0.
	PID() int
	// Exited is closed when the engine lets go of the sandbox: it stopped by
	// itself (e.g. the host killed it for exceeding its memory limit), or
	// it was destroyed, or the engine was closed.
	Exited() <-chan struct{}
	// ExitReason says why the sandbox stopped by itself, once Exited is
	// closed; it is empty after Destroy or Close.
	ExitReason() string
}

// Engine creates and destroys sandboxes.
type Engine interface {
	// Name returns the engine's name, e.g. "gvisor".
	Name() string
	// Create boots a sandbox and returns once its agent is connected. On
	// error nothing of the sandbox is left behind.
	Create(ctx context.Context, spec Spec) (Sandbox, error)
	// Attach reconnects to a sandbox created earlier, by this or a previous
	// process. It returns an errdefs NotFound error when the sandbox is no
	// longer running, and an Unavailable one when it runs but could not be
	// reached before ctx ended or the engine's wait ran out (a loaded
	// host, a frozen sandbox): a later Attach may succeed, so the caller
	// must not destroy it for that.
	Attach(ctx context.Context, spec Spec) (Sandbox, error)
	// Destroy stops the sandbox and removes all its resources. Destroying a
	// sandbox that is already gone, or half created, returns nil.
	Destroy(ctx context.Context, id string) error
	// List returns the ids of every sandbox the engine holds resources for,
	// running or not, so callers can find leaks.
	List(ctx context.Context) ([]string, error)
	// Close releases the engine's connections to its sandboxes, which keep
	// running for a later Attach.
	Close() error
}

// Snapshotter is an engine that can freeze a sandbox to disk and restore
// copies of it. Engines without it cannot snapshot, fork or sleep.
type Snapshotter interface {
	// Checkpoint writes the sandbox's whole state (memory, processes, its
	// written files) into dir. With leaveRunning the sandbox goes on and is
	// ready again when Checkpoint returns; without, the sandbox stops and
	// only Destroy is left to do, and ctx's seal (WithSeal) runs once the
	// image is complete, before the sandbox stops. An error (the seal's
	// included) leaves a running sandbox running.
	Checkpoint(ctx context.Context, id, dir string, leaveRunning bool) error
	// Restore creates a new sandbox from a checkpoint in dir and returns once
	// its agent is connected. spec gives the new sandbox's id; its resources
	// must match the checkpointed sandbox's. The guest still has the
	// checkpointed sandbox's setup (hostname): the caller applies the new
	// one with guest.Conn.Reconfigure. On error nothing of it is left behind.
	Restore(ctx context.Context, spec Spec, dir string) (Sandbox, error)
}

// HostnameSetter is a Sandbox whose engine set its guest's hostname as it
// started it (a qemu restore sets the spec's in the frame that steps the
// clock and reseeds the entropy pool): the caller need not Reconfigure it
// for that, one round trip into the guest less per fork child.
type HostnameSetter interface {
	// HostnameSet is the hostname the engine set, "" if none.
	HostnameSet() string
}

// Preparer is an engine that can do the slow part of making a sandbox
// ahead of time. A later Create or Restore with the same spec ID (and the
// same resources) finishes faster, but its guest may keep the hostname it
// was prepared with: the caller applies spec's with guest.Conn.Reconfigure.
// Destroy removes a prepared sandbox that was never used.
type Preparer interface {
	Prepare(ctx context.Context, spec Spec) error
}

// ForkSharer is an engine whose sandboxes restored from a checkpoint map
// its memory privately (copy-on-write): what a child has not written stays
// shared with its siblings, so a fresh child holds a small part of its
// memory limit (qemu: ~30 MiB of a 512 MiB guest). Admission counts such
// children at what they take, not at their limits.
type ForkSharer interface {
	// SharesForkMemory reports whether children restored from the
	// checkpoint in dir share its memory; with dir empty, whether children
	// of a checkpoint of the running sandbox id would.
	SharesForkMemory(ctx context.Context, id, dir string) bool
}

// Inspector is an engine that can tell a sandbox that was started (and may
// hold a user's state) from one that was only prepared. Reconcile destroys
// unrecorded prepared sandboxes (a killed daemon's warm pool) and keeps
// unrecorded started ones unless told otherwise.
type Inspector interface {
	// Started reports whether the engine sandbox id was ever started. An id
	// the engine does not know is not started.
	Started(ctx context.Context, id string) bool
}

// Stats is one reading of a running sandbox's resource use.
type Stats struct {
	// CPUNanos is the CPU time the sandbox has used since it started, in
	// nanoseconds (cumulative: a rate needs two readings).
	CPUNanos uint64
	// MemoryBytes is the memory the sandbox uses now, page cache that the
	// kernel can drop at once excluded; MemoryLimitBytes its cap (0: none
	// known).
	MemoryBytes      uint64
	MemoryLimitBytes uint64
	// Pids counts the processes running inside the sandbox; 0 (unknown)
	// for a reading whose ctx came from WithoutPids.
	Pids int
}

// Statser is an engine that can read a sandbox's resource use.
type Statser interface {
	// Stats reads the current use of the running sandbox id. It returns an
	// errdefs NotFound error when the sandbox is not running.
	Stats(ctx context.Context, id string) (Stats, error)
}

type sealKey struct{}

// WithSeal returns ctx carrying seal, which a Checkpoint that stops its
// sandbox calls once the image is complete and before the sandbox stops.
// So a caller that marks the image whole in seal never leaves, should it
// die at any moment, a stopped sandbox with an unmarked image: it leaves
// either a running sandbox or a marked image.
func WithSeal(ctx context.Context, seal func() error) context.Context {
	return context.WithValue(ctx, sealKey{}, seal)
}

type noPidsKey struct{}

// WithoutPids marks ctx for a Stats reading that needs no process count
// (Stats.Pids): an engine that must ask the sandbox's kernel for it (gVisor:
// a runsc process per reading, ~50 ms of CPU) leaves it out.
func WithoutPids(ctx context.Context) context.Context {
	return context.WithValue(ctx, noPidsKey{}, true)
}

// PidsWanted reports whether a Stats reading under ctx must count the
// processes (no WithoutPids).
func PidsWanted(ctx context.Context) bool {
	no, _ := ctx.Value(noPidsKey{}).(bool)
	return !no
}

// Seal runs ctx's seal (WithSeal), if it has one. Engines call it in
// Checkpoint, between a complete image and stopping the sandbox.
func Seal(ctx context.Context) error {
	if seal, ok := ctx.Value(sealKey{}).(func() error); ok {
		return seal()
	}
	return nil
}
