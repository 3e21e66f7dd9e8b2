package store

import "context"

// The store's domains, each an interface its consumers take: the lifecycle
// service the sandboxes, snapshots, pool and images; volumes and secrets
// their own. *Store, on one SQLite database, is every one of them (All);
// another implementation (a cluster's, say) passes the same suite
// (internal/store/storetest). Every method's contract is on *Store's.

// Sandboxes holds the sandbox records: state transitions are
// compare-and-set on the stored state; names are unique.
type Sandboxes interface {
	InsertSandbox(ctx context.Context, sb Sandbox) error
	SetState(ctx context.Context, id, state, msg string) error
	Transition(ctx context.Context, id, from, to, msg string) error
	TransitionAll(ctx context.Context, ids []string, from, to string) error
	SetOptions(ctx context.Context, id string, o Options) error
	SetEngineID(ctx context.Context, id, engineID string) error
	GetSandbox(ctx context.Context, ref string) (Sandbox, error)
	ListSandboxes(ctx context.Context) ([]Sandbox, error)
	CommittedMemoryMiB(ctx context.Context) (int, error)
	DeleteSandbox(ctx context.Context, id string) error
	// Taken reports whether ref names a sandbox (id or name) now.
	Taken(ref string) bool
}

// Snapshots holds the snapshot records.
type Snapshots interface {
	InsertSnapshot(ctx context.Context, sn Snapshot) error
	SetSnapshotImplicit(ctx context.Context, id string) error
	SetSnapshotReady(ctx context.Context, id string, size int64) error
	GetSnapshot(ctx context.Context, ref string) (Snapshot, error)
	ListSnapshots(ctx context.Context) ([]Snapshot, error)
	SnapshotUsers(ctx context.Context, id string) ([]string, error)
	DeleteSnapshot(ctx context.Context, id string) error
}

// Images holds the image records, the image roots in use and the build
// sandboxes.
type Images interface {
	GetImage(ctx context.Context, name string) (Image, error)
	GetImageByRef(ctx context.Context, ref string) (Image, error)
	ListImages(ctx context.Context) ([]Image, error)
	PutImage(ctx context.Context, img Image) (old Image, ok bool, err error)
	AdoptImage(ctx context.Context, img Image) (bool, error)
	SetImageSnapshot(ctx context.Context, name, snapshot string) (Image, error)
	ImageUsers(ctx context.Context, name string) ([]string, error)
	DeleteImage(ctx context.Context, name string) (Image, error)
	AddImageRoot(ctx context.Context, rootfs string) error
	FinishPendingImageRoots(ctx context.Context, roots ...string) error
	CollectImageRoots(ctx context.Context) ([]string, error)
	AddBuildSandbox(ctx context.Context, id string) error
	RemoveBuildSandbox(ctx context.Context, id string) error
	BuildSandboxes(ctx context.Context) ([]string, error)
}

// Pool marks the hot pool's record-less sandboxes, so a restart destroys
// unclaimed ones; a claim records the sandbox and drops its mark at once.
type Pool interface {
	AddPoolSandbox(ctx context.Context, id string) error
	RemovePoolSandbox(ctx context.Context, id string) error
	PoolSandboxes(ctx context.Context) ([]string, error)
	ClaimPoolSandbox(ctx context.Context, sb Sandbox) error
}

// Volumes holds the named volumes' records.
type Volumes interface {
	InsertVolume(ctx context.Context, v Volume) error
	SetVolumeState(ctx context.Context, id, state string) error
	SetVolumeImported(ctx context.Context, id string, size int64) error
	GetVolume(ctx context.Context, ref string) (Volume, error)
	ListVolumes(ctx context.Context) ([]Volume, error)
	DeleteVolume(ctx context.Context, id string) error
}

// Secrets holds sealed secrets and the at-rest key's check value.
type Secrets interface {
	PutSecret(ctx context.Context, name string, seal func(version int) []byte) (Secret, error)
	GetSecret(ctx context.Context, name string) (Secret, error)
	SecretValue(ctx context.Context, name string, version int) ([]byte, error)
	ListSecrets(ctx context.Context) ([]Secret, error)
	AllSealedSecrets(ctx context.Context) (names []string, versions []int, sealed [][]byte, err error)
	DeleteSecret(ctx context.Context, name string) error
	PruneSecretVersions(ctx context.Context, name string, keep map[int]bool) error
	KeyCheck(ctx context.Context) ([]byte, error)
	SetKeyCheck(ctx context.Context, sealed []byte) error
}

// All is every domain on one store, with its health.
type All interface {
	Sandboxes
	Snapshots
	Images
	Pool
	Volumes
	Secrets
	// Node names the node whose records the store writes (Sandbox.Node,
	// Snapshot.Node).
	Node() string
	// Check reports whether the store can take writes (Unavailable when
	// its database was removed or replaced).
	Check() error
	Close() error
}

var _ All = (*Store)(nil)
