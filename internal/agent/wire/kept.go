package wire

// Kept commands: an OpExec with Request.Keep outlives its channel. When the
// host connection ends (a sleep's quiesce, a daemon restart) or the host
// closes the channel, the agent detaches it instead of killing it: the
// process runs on, its further output is kept in a bounded buffer (see
// KeptBuffer) and its exit until a host collects it. OpAttach by PID
// replays what was kept and streams the rest; OpKept lists them. Only for
// an agent with FeatureKeep.

// FeatureKeep: the agent serves Request.Keep, OpAttach and OpKept.
const FeatureKeep = "keep"

const (
	// OpAttach attaches the channel to the kept command Request.PID:
	// Started (with its pid), then the output it made while detached
	// (stdout and stderr frames, in the order it was made; if the buffer
	// overflowed, a note of how much was lost comes first on stderr), then
	// its live output, then its Exit. Stdin frames (Request.Stdin) go to
	// its stdin; a Signal signals it; a Close detaches again. A newer
	// attach takes the command over (the older channel ends with an Exit
	// whose Error says so). An Exit with a not_found Error: no such kept
	// command (never kept, collected, or evicted).
	OpAttach Op = "attach"
	// OpKept lists the kept commands: its stdout carries a JSON array of
	// KeptCommand, then an empty Exit.
	OpKept Op = "kept"
)

// KeptBuffer bounds the output one detached kept command holds (stdout and
// stderr together). Past it the oldest output is dropped (the next attach
// is told how much): a detached command is never blocked on its output, so
// a server logging while nobody listens lives on. While a host is attached
// the command is held back by the host's flow control instead, as any
// exec.
const KeptBuffer = 256 << 10

// MaxKept bounds the kept commands still running; an exec with Keep past
// it is refused (resource_exhausted). MaxKeptEnded bounds those that ended
// with nobody attached: past it the one that ended first is forgotten.
const (
	MaxKept      = 64
	MaxKeptEnded = 32
)

// MaxTag bounds Request.Tag.
const MaxTag = 16 << 10

// KeptCommand is one kept command, as OpKept lists it.
type KeptCommand struct {
	PID  int      `json:"pid"`
	Argv []string `json:"argv"`
	// Tag is the host's label from the exec's Request.Tag (opaque to the
	// agent).
	Tag string `json:"tag,omitempty"`
	// StartedMS is when it started (Unix milliseconds, the sandbox's clock).
	StartedMS int64 `json:"started_ms"`
	// Stdin: it was started with Request.Stdin and its stdin is open.
	Stdin bool `json:"stdin,omitempty"`
	// Ended: it exited and nobody has collected its exit yet; Exit is how.
	Ended bool     `json:"ended,omitempty"`
	Exit  *ExitMsg `json:"exit,omitempty"`
	// Attached: a host channel follows it now.
	Attached bool `json:"attached,omitempty"`
}
