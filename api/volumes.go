package api

import "time"

// Volume is a named volume: a fixed-size file system that outlives the
// sandboxes that mount it.
type Volume struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// SizeBytes is the volume's size: writes past it fail with ENOSPC.
	SizeBytes int64 `json:"size_bytes"`
	// UsedBytes is what the volume takes on the host's disk now.
	UsedBytes int64     `json:"used_bytes"`
	CreatedAt time.Time `json:"created_at"`
	// UsedBy lists the sandboxes that mount the volume itself (fork
	// children with their own copies are not listed).
	UsedBy []string `json:"used_by,omitempty"`
	// Mounted says whether a running sandbox has it mounted now.
	Mounted bool `json:"mounted,omitempty"`
	// Encrypted says the volume has a key of its own (never shown here:
	// GET /v1/volumes/{name}/key hands it out for an export).
	Encrypted bool `json:"encrypted"`
}

// VolumeKey is the answer of GET /v1/volumes/{name}/key: an encrypted
// volume's key, hex of 32 bytes. With an export (GET
// /v1/volumes/{name}/export, a tar of ciphertext) it opens the volume on
// another host: POST /v1/volumes/{name}/import with the tar as the body
// and the key in the VolumeKeyHeader header.
type VolumeKey struct {
	Key string `json:"key"`
}

// VolumeKeyHeader carries an imported volume's key.
const VolumeKeyHeader = "Clade-Volume-Key"

// CreateVolumeRequest is the body of POST /v1/volumes.
type CreateVolumeRequest struct {
	Name string `json:"name"`
	// SizeBytes is the volume's size; 0 takes the default (1 GiB).
	SizeBytes int64 `json:"size_bytes,omitempty"`
	// Encrypt gives the volume a key of its own, so that it can move to
	// another host (export and import) and be opened there.
	Encrypt bool `json:"encrypt,omitempty"`
	// Key (with Encrypt) is the volume's key, hex of 32 bytes, as
	// `clade volume export --key-file` writes it: the volume is then
	// encrypted with a key its owner holds. Empty: a random one.
	Key string `json:"key,omitempty"`
}

// VolumeMount is a volume a sandbox mounts.
type VolumeMount struct {
	// Name is the volume's name (or id).
	Name string `json:"name"`
	// Path is the absolute path inside the sandbox.
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
	// Shared: sandboxes forked from this one mount this same volume
	// rather than a copy of it as it was at the snapshot.
	Shared bool `json:"shared,omitempty"`
	// Clone (in responses only) says that the sandbox mounts its own copy
	// of the volume, made from its snapshot's by "reflink" or "copy".
	Clone string `json:"clone,omitempty"`
}
