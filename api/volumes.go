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
}

// CreateVolumeRequest is the body of POST /v1/volumes.
type CreateVolumeRequest struct {
	Name string `json:"name"`
	// SizeBytes is the volume's size; 0 takes the default (1 GiB).
	SizeBytes int64 `json:"size_bytes,omitempty"`
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
