package api

import (
	"encoding/json"
	"time"
)

// Node is one daemon of a cluster (GET /v1/nodes).
type Node struct {
	Name string `json:"name"`
	// Addr is the address other nodes reach its API on (--advertise).
	Addr    string `json:"addr"`
	Version string `json:"version,omitempty"`
	// Self is true for the node that answered.
	Self     bool         `json:"self,omitempty"`
	Capacity NodeCapacity `json:"capacity"`
	// JoinedAt is when it registered; RefreshedAt when it last wrote
	// its capacity (about every second while it lives).
	JoinedAt    time.Time `json:"joined_at"`
	RefreshedAt time.Time `json:"refreshed_at"`
	// LeaseAgeMS is how long ago, by the answering node's clock, the
	// node last refreshed; its key goes when its lease lapses.
	LeaseAgeMS int64 `json:"lease_age_ms"`
	// Draining is true while the node takes no new placements (clade
	// node drain).
	Draining bool `json:"draining,omitempty"`
	// Drain is the drained node's own account of its drain (it writes
	// it with its capacity, about every second): what moved, what is
	// left and what holds it.
	Drain *DrainProgress `json:"drain,omitempty"`
}

// DrainProgress is how a node's drain goes. The drained node moves its
// sleeping sandboxes whose image is in the object store, and puts its
// idle running ones to sleep to move them too (woken at once on their new
// node); busy ones stay until they are idle.
type DrainProgress struct {
	// Moved counts the sandboxes given to other nodes since the drain
	// began; Running and Sleeping those still on the node.
	Moved    int `json:"moved"`
	Running  int `json:"running"`
	Sleeping int `json:"sleeping"`
	// Held are the sandboxes that stay for now, each with why.
	Held []DrainHold `json:"held,omitempty"`
	// Settled is true when the last pass had nothing under way: what is
	// left is held (busy, or unable to move). Pass counts the passes.
	Settled bool  `json:"settled"`
	Pass    int64 `json:"pass"`
	// Note says what keeps the whole node from moving its sandboxes
	// (no --object-store), when something does.
	Note string `json:"note,omitempty"`
	// Retried says the last sandbox held for room that the drain moved
	// on as soon as a node had room for it (a capacity refresh showed
	// it, a move was done, a node joined); Retries counts them.
	Retried string `json:"retried,omitempty"`
	Retries int    `json:"retries,omitempty"`
}

// DrainHold is a sandbox a drain leaves on its node for now.
type DrainHold struct {
	ID    string `json:"id"`
	Name  string `json:"name,omitempty"`
	State string `json:"state"`
	// Busy is true when it stays only while it is in use (it moves once
	// idle); Why says what holds it.
	Busy bool   `json:"busy,omitempty"`
	Why  string `json:"why"`
}

// NodeCapacity is what a node has for placement.
type NodeCapacity struct {
	// MemoryTotalMiB is the host's memory; MemAvailableMiB its
	// MemAvailable; MemoryAdmittedMiB the memory limits of the sandboxes
	// that hold memory (running ones), as admission counts them.
	MemoryTotalMiB    int64 `json:"memory_total_mib"`
	MemAvailableMiB   int64 `json:"mem_available_mib"`
	MemoryAdmittedMiB int64 `json:"memory_admitted_mib"`
	// MemoryStartingMiB is the part of MemoryAdmittedMiB of sandboxes
	// being made or woken: its admission holds it against MemAvailable
	// too until they run. Admits are the ids of the sandboxes
	// MemoryAdmittedMiB counts that were admitted lately (the last 30 s)
	// or are being made or woken, Starting those being made or woken,
	// read at the same moment: a node that sent it a create, a wake or a
	// move stops counting it once its capacity names it, so that each is
	// counted once.
	MemoryStartingMiB int64    `json:"memory_starting_mib,omitempty"`
	Admits            []string `json:"admits,omitempty"`
	Starting          []string `json:"starting,omitempty"`
	// MemoryFloorMiB is the MemAvailable its creates must leave free
	// (--memory-floor); MemoryLimitMiB what the admitted limits may add
	// up to (--memory-overcommit x total; 0: no cap); DefaultMemoryMiB
	// the limit of a sandbox that asks for none.
	MemoryFloorMiB   int64 `json:"memory_floor_mib,omitempty"`
	MemoryLimitMiB   int64 `json:"memory_limit_mib,omitempty"`
	DefaultMemoryMiB int64 `json:"default_memory_mib,omitempty"`
	// MaxMemoryMiB and MaxCPUs are the largest sandbox it takes
	// (--max-memory, --max-cpus): a sleeping sandbox is given only to a
	// node it fits.
	MaxMemoryMiB int64   `json:"max_memory_mib,omitempty"`
	MaxCPUs      float64 `json:"max_cpus,omitempty"`
	// Sandboxes counts the sandboxes it holds, Running those running.
	Sandboxes int `json:"sandboxes"`
	Running   int `json:"running"`
	Cores     int `json:"cores"`
	// Engines are the engines it runs; Images the images it has.
	Engines []string `json:"engines,omitempty"`
	Images  []string `json:"images,omitempty"`
	// StoreKey says which key its copies in the object store are sealed
	// under: "plain" (no --encrypt-at-rest), "sealed:ID" (an identifier
	// of the key, not the key), empty without --object-store. A sleeping
	// sandbox moves only to a node whose StoreKey is its image's.
	StoreKey string `json:"store_key,omitempty"`
}

// SnapshotExport describes a sealed snapshot that another node of a
// cluster may restore (a fork across nodes): what its record holds, the
// identity of its image root and its sealed image's digest. Sent between
// nodes on the peer-only /v1/internal/ routes (cluster token); not part of
// the public API.
type SnapshotExport struct {
	ID      string `json:"id"`
	Name    string `json:"name,omitempty"`
	Sandbox string `json:"sandbox,omitempty"`
	Image   string `json:"image"`
	// ImageID is the identity of the image root the snapshot stands on
	// (sandbox.RootID): a target restores it only on the very same root.
	ImageID   string          `json:"image_id"`
	MemoryMiB int             `json:"memory_mib"`
	CPUs      float64         `json:"cpus"`
	Env       []string        `json:"env,omitempty"`
	Opts      json.RawMessage `json:"opts,omitempty"`
	Engine    string          `json:"engine,omitempty"`
	Digest    string          `json:"digest"`
	SizeBytes int64           `json:"size_bytes"`
	// Local, when set, says why the snapshot's children stay on its node
	// (volumes and secrets are each node's own).
	Local string `json:"local,omitempty"`
}
