package api

import "time"

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
}

// NodeCapacity is what a node has for placement.
type NodeCapacity struct {
	// MemoryTotalMiB is the host's memory; MemAvailableMiB its
	// MemAvailable; MemoryAdmittedMiB the memory limits of the sandboxes
	// that hold memory (running ones), as admission counts them.
	MemoryTotalMiB    int64 `json:"memory_total_mib"`
	MemAvailableMiB   int64 `json:"mem_available_mib"`
	MemoryAdmittedMiB int64 `json:"memory_admitted_mib"`
	// MemoryFloorMiB is the MemAvailable its creates must leave free
	// (--memory-floor); MemoryLimitMiB what the admitted limits may add
	// up to (--memory-overcommit x total; 0: no cap); DefaultMemoryMiB
	// the limit of a sandbox that asks for none.
	MemoryFloorMiB   int64 `json:"memory_floor_mib,omitempty"`
	MemoryLimitMiB   int64 `json:"memory_limit_mib,omitempty"`
	DefaultMemoryMiB int64 `json:"default_memory_mib,omitempty"`
	// Sandboxes counts the sandboxes it holds, Running those running.
	Sandboxes int `json:"sandboxes"`
	Running   int `json:"running"`
	Cores     int `json:"cores"`
	// Engines are the engines it runs; Images the images it has.
	Engines []string `json:"engines,omitempty"`
	Images  []string `json:"images,omitempty"`
}
