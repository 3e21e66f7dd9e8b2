// Package wire is the binary framing shared by the in-sandbox agent and the
// host. One connection carries many channels (one per exec or file transfer);
// every frame names its channel, so no call pays for a new connection and bulk
// data travels as raw bytes, never base64.
//
// A frame is a 9-byte header followed by the payload:
//
//	type    uint8
//	channel uint32 big-endian
//	length  uint32 big-endian (at most MaxPayload)
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Version is bumped on any incompatible change to frames or their payloads.
const Version = 1

// HeaderSize is the size of a frame header in bytes.
const HeaderSize = 9

// MaxPayload bounds one frame so a corrupt or hostile length cannot make the
// reader allocate without limit.
const MaxPayload = 1 << 20

// Type is a frame type.
type Type uint8

const (
	// Hello (agent -> host, channel 0): JSON HelloMsg.
	Hello Type = iota + 1
	// Open (host -> agent): JSON Request; opens the channel.
	Open
	// Started (agent -> host): JSON StartedMsg; the process runs.
	Started
	// Stdin, Stdout, Stderr carry raw stream bytes. An empty payload is EOF.
	Stdin
	Stdout
	Stderr
	// Window (either way): 1 byte stream type + uint32 bytes consumed; grants
	// the sender that much more credit on that stream.
	Window
	// Signal (host -> agent): the channel's process gets the signal encoded
	// by stream.SignalPayload (clade's one signal encoding).
	Signal
	// Exit (agent -> host): JSON ExitMsg; the last frame of a channel.
	Exit
	// Ping and Pong (either way, channel 0): liveness, payload echoed.
	Ping
	Pong
	// Close (host -> agent): the host gave up on the channel; the agent kills
	// what runs on it and frees it.
	Close
	// Quiesce (host -> agent, channel 0): a snapshot is coming. The agent
	// detaches its channels (their processes keep running), closes the
	// connection and redials every millisecond, so that it reconnects at
	// once in the running parent and in every restored copy. A dialled-out
	// connection caught by a checkpoint would otherwise look alive to the
	// agent forever. The agent answers with a Quiesce of its own before it
	// hangs up: over a virtio port (a VM) the host cannot see the hang-up.
	Quiesce
	// Resize (host -> agent): a terminal channel's new size, encoded by
	// stream.ResizePayload. Only sent to an agent whose hello lists
	// FeaturePTY; an older agent drops a connection that sends it.
	Resize
	// Key (host -> agent, channel 0): the agent's new key (see
	// HelloMsg.Key), which it keeps in its memory only and presents in
	// every later hello. The agent answers with an empty Key frame once it
	// holds it; until then the host also accepts the keys it held before.
	// Only sent to an agent whose hello lists FeatureAuth.
	Key
	typeEnd
)

func (t Type) String() string {
	names := [...]string{"invalid", "hello", "open", "started", "stdin", "stdout", "stderr", "window", "signal", "exit", "ping", "pong", "close", "quiesce", "resize", "key"}
	if int(t) < len(names) {
		return names[t]
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Frame is one decoded frame. Payload is only valid until the next Read on
// the same Reader.
type Frame struct {
	Type    Type
	Channel uint32
	Payload []byte
}

// ErrFrame marks a malformed frame; the connection must be dropped.
var ErrFrame = errors.New("malformed frame")

// Reader decodes frames from a stream. It reads as much as the stream has
// into one buffer and cuts frames out of it, so a burst of frames costs one
// read (under gVisor every read is a trap into the sentry) and a payload is
// not copied on its way out.
type Reader struct {
	r          io.Reader
	buf        []byte
	start, end int // the unread bytes are buf[start:end]
}

// Reader buffer sizes: a small one to begin with and after a burst of big
// frames (a daemon holds one reader per sandbox), a large one while big
// frames flow.
const (
	readerMin = 64 << 10
	readerMax = MaxPayload + HeaderSize + 64<<10
)

// NewReader returns a Reader on r. It buffers by itself: do not wrap r in a
// bufio.Reader.
func NewReader(r io.Reader) *Reader { return &Reader{r: r} }

// Read returns the next frame. It returns io.EOF at a clean end between
// frames, io.ErrUnexpectedEOF inside a frame and ErrFrame for bad headers.
// The payload is only valid until the next Read.
func (r *Reader) Read() (Frame, error) {
	if err := r.fill(HeaderSize); err != nil {
		return Frame{}, err
	}
	f, n, err := ParseHeader(r.buf[r.start:r.end])
	if err != nil {
		return Frame{}, err
	}
	total := HeaderSize + int(n)
	if err := r.fill(total); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	f.Payload = r.buf[r.start+HeaderSize : r.start+total : r.start+total]
	r.start += total
	if r.start == r.end {
		r.start, r.end = 0, 0
		if len(r.buf) > readerMin && total < readerMin {
			// A burst of big frames ended: give the big buffer back (the
			// payload just returned keeps its own part alive).
			r.buf = nil
		}
	}
	return f, nil
}

// fill reads until at least need bytes are unread. It returns io.EOF only
// when the stream ended with nothing unread.
func (r *Reader) fill(need int) error {
	if r.end-r.start >= need {
		return nil
	}
	if len(r.buf) < need {
		// Room for a few frames of this size, so one read can take them.
		size := min(max(readerMin, 4*need), readerMax)
		size = max(size, need)
		b := make([]byte, size)
		r.end = copy(b, r.buf[r.start:r.end])
		r.start, r.buf = 0, b
	} else if len(r.buf)-r.start < need {
		r.end = copy(r.buf, r.buf[r.start:r.end])
		r.start = 0
	}
	for r.end-r.start < need {
		n, err := r.r.Read(r.buf[r.end:])
		r.end += n
		if err != nil {
			if r.end-r.start >= need {
				return nil
			}
			if err == io.EOF && r.end > r.start {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// ParseHeader decodes a frame header and returns the frame (without payload)
// and the payload length.
func ParseHeader(h []byte) (Frame, uint32, error) {
	if len(h) < HeaderSize {
		return Frame{}, 0, fmt.Errorf("%w: short header", ErrFrame)
	}
	t := Type(h[0])
	if t == 0 || t >= typeEnd {
		return Frame{}, 0, fmt.Errorf("%w: unknown type %d", ErrFrame, h[0])
	}
	n := binary.BigEndian.Uint32(h[5:9])
	if n > MaxPayload {
		return Frame{}, 0, fmt.Errorf("%w: payload of %d bytes exceeds %d", ErrFrame, n, MaxPayload)
	}
	return Frame{Type: t, Channel: binary.BigEndian.Uint32(h[1:5])}, n, nil
}

// AppendFrame appends the encoding of one frame to b.
func AppendFrame(b []byte, t Type, ch uint32, payload []byte) []byte {
	return append(AppendHeader(b, t, ch, len(payload)), payload...)
}

// AppendHeader appends a frame header for a payload of n bytes to b.
func AppendHeader(b []byte, t Type, ch uint32, n int) []byte {
	b = append(b, byte(t))
	b = binary.BigEndian.AppendUint32(b, ch)
	return binary.BigEndian.AppendUint32(b, uint32(n))
}

// HelloMsg is the first frame an agent sends on a connection.
type HelloMsg struct {
	Version int `json:"version"`
	PID     int `json:"pid"`
	// Boot counts how many times the agent has (re)connected since it
	// started; a restored sandbox reconnects with a higher count.
	Boot int `json:"boot"`
	// Features lists what this agent can do beyond protocol Version's
	// base (e.g. FeaturePTY); the host asks for nothing an agent lacks,
	// since the agents inside older snapshots live on.
	Features []string `json:"features,omitempty"`
	// Key proves that the hello comes from the sandbox's agent, PID 1,
	// and not from another process inside the sandbox (every one of them
	// can reach the agent's socket): it is the last key the host sent the
	// agent (a Key frame), held in the agent's memory only. An agent that
	// never got one (a fresh boot) sends none; the host accepts that only
	// while nothing but the agent can run in the sandbox.
	Key []byte `json:"key,omitempty"`
}

// FeatureAuth: the agent presents its key in the hello and takes Key
// frames. The host refuses an agent without it.
const FeatureAuth = "auth"

// KeySize is the size of an agent key in bytes.
const KeySize = 32

// FeaturePTY: the agent runs an OpExec with TTY on a pseudo-terminal and
// takes Resize frames.
const FeaturePTY = "pty"

// FeatureSecretEnv: the agent takes an OpIdentity's SecretEnv.
const FeatureSecretEnv = "secret-env"

// FeatureUser: the agent runs an OpExec as Request.User and makes what an
// OpTarPut writes owned by it. An older agent ignores the field (and would
// run the exec as root): the host sends it to no agent without this.
const FeatureUser = "user"

// FeatureWatch: the agent serves OpWatch.
const FeatureWatch = "watch"

// FeatureXattr: the agent serves OpXattrGet and OpXattrSet.
const FeatureXattr = "xattr"

// FeatureKillAll: the agent serves OpKillAll.
const FeatureKillAll = "kill-all"

// FeatureWriteThrough: the agent takes an OpTarPut's Through.
const FeatureWriteThrough = "write-through"

// Bounds of OpXattrGet and OpXattrSet: paths per request, and the bytes of
// one path's attributes (names, with the prefix, and values), as E2B's
// envd bounds a file's metadata to stay in an inode's xattr space.
const (
	MaxXattrPaths = 64
	MaxXattrBytes = 4096
)

// Op names what a channel does.
type Op string

const (
	OpExec   Op = "exec"    // run a process
	OpTarGet Op = "tar-get" // stream Path as a tar archive on stdout
	OpTarPut Op = "tar-put" // extract the tar archive read from stdin into Path
	OpStatFS Op = "stat"    // report whether Path exists and is a directory
	// OpIdentity applies the host's guest configuration (today the
	// hostname). Its name predates that; it stays for the agents inside
	// existing snapshots.
	OpIdentity Op = "identity"
	// OpDial connects to 127.0.0.1:Port inside the sandbox and pipes the
	// channel's stdin to the socket and the socket to stdout. Started
	// answers a connection made; an Exit with Error a connection refused.
	// Stdin EOF half-closes the socket's write side; the socket's EOF is
	// stdout's EOF. The channel ends when both directions have, or on Close.
	OpDial Op = "dial"
	// OpWatch follows changes under the directory Path with inotify
	// (below it too with Recursive): Started answers a watch armed, then
	// stdout carries one WatchEvent per line (JSON) until Close. An Exit
	// with Error ends a watch that cannot go on (its directory removed,
	// the event queue overflowed, too many directories). Only for an agent
	// with FeatureWatch.
	OpWatch Op = "watch"
	// OpXattrGet reads the extended attributes named XattrPrefix+KEY
	// (XattrPrefix in the user. namespace) of each of Paths, not
	// following a final symlink: the Exit's Info is a JSON list with one
	// KEY -> value object per path, null where it has none, is missing,
	// or holds more than MaxXattrBytes of them. Only for an agent with
	// FeatureXattr.
	OpXattrGet Op = "xattr-get"
	// OpXattrSet replaces the extended attributes named XattrPrefix+KEY
	// of Path (not following a final symlink) with Xattrs: those not in
	// it are removed. Only for an agent with FeatureXattr.
	OpXattrSet Op = "xattr-set"
	// OpKillAll kills every process of the sandbox but the agent (PID 1)
	// until none is left, itself, with no program of the sandbox's (a
	// sandbox whose /bin/sh is gone or replaced is still emptied): the
	// wake of a sleep without memory. Only for an agent with
	// FeatureKillAll.
	OpKillAll Op = "kill-all"
)

// WatchEvent is one change an OpWatch reports: Op is "create", "write",
// "remove", "rename" (the old name of a moved entry; the new one is a
// create) or "chmod"; Name is the entry's path relative to the watched
// directory.
type WatchEvent struct {
	Op   string `json:"op"`
	Name string `json:"name"`
}

// MaxWatchLine bounds one WatchEvent line (a name of PATH_MAX and the
// JSON around it, escaped).
const MaxWatchLine = 6 * 4096

// Request opens a channel.
type Request struct {
	Op   Op       `json:"op"`
	Argv []string `json:"argv,omitempty"`
	Env  []string `json:"env,omitempty"`
	Dir  string   `json:"dir,omitempty"`
	// TimeoutMS kills the process group after this long; 0 means none.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Stdin says the host will send stdin frames; otherwise stdin is empty.
	Stdin bool   `json:"stdin,omitempty"`
	Path  string `json:"path,omitempty"`
	// Hostname is the new hostname for OpIdentity.
	Hostname string `json:"hostname,omitempty"`
	// ClockNS, when set, steps the guest's clock to this Unix time in
	// nanoseconds (OpIdentity; a restored VM wakes with its parent's time).
	ClockNS int64 `json:"clock_ns,omitempty"`
	// Seed, when set, is mixed into the guest kernel's entropy pool, which
	// is then reseeded (OpIdentity; a restored VM has its parent's pool).
	Seed []byte `json:"seed,omitempty"`
	// SecretEnv, when set, replaces the KEY=VALUE entries the agent holds
	// in its memory only and merges into every later exec's environment
	// (over its base environment, under the exec's own): the sandbox's
	// secrets, which therefore never pass through the engine's files on
	// the host (OpIdentity; only for an agent with FeatureSecretEnv).
	SecretEnv []string `json:"secret_env,omitempty"`
	// Exclude lists absolute paths an OpTarGet leaves out, with what is
	// below them.
	Exclude []string `json:"exclude,omitempty"`
	// Port is the TCP port an OpDial connects to on the sandbox's loopback.
	Port int `json:"port,omitempty"`
	// TTY runs an OpExec on a new pseudo-terminal (its controlling
	// terminal, in a new session): its output comes on Stdout only, and
	// stdin is what is typed. Rows and Cols are the terminal's first size
	// (0: 24x80). Only for an agent with FeaturePTY.
	TTY  bool   `json:"tty,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
	// User is who an OpExec runs as — a name, "uid", "uid:gid" or
	// "name:group", resolved against the sandbox's /etc/passwd and
	// /etc/group — with that user's supplementary groups, HOME, USER,
	// LOGNAME and SHELL (under Env), starting in its home unless Dir is
	// set; for an OpTarPut, who owns what is written. Empty: the image's
	// user for an exec, the archive's owners for an upload. Only for an
	// agent with FeatureUser.
	User string `json:"user,omitempty"`
	// Recursive makes an OpWatch follow the directories below Path too.
	Recursive bool `json:"recursive,omitempty"`
	// Paths are what an OpXattrGet reads (at most MaxXattrPaths).
	Paths []string `json:"paths,omitempty"`
	// XattrPrefix is the attribute names OpXattrGet and OpXattrSet
	// handle (e.g. "user.e2b."); Xattrs what OpXattrSet sets, KEY ->
	// value, the prefix left out.
	XattrPrefix string            `json:"xattr_prefix,omitempty"`
	Xattrs      map[string]string `json:"xattrs,omitempty"`
	// Keep makes an OpExec (not a TTY one) a kept command that outlives
	// its channel, and Tag is the host's label for it (at most MaxTag
	// bytes); PID names the kept command of an OpAttach. See kept.go.
	// Only for an agent with FeatureKeep.
	Keep bool   `json:"keep,omitempty"`
	Tag  string `json:"tag,omitempty"`
	PID  int    `json:"pid,omitempty"`
	// Through makes an OpTarPut write its files as a program of User
	// writes a file, not as `docker cp` places entries: Path must be an
	// existing directory and the archive hold regular files named by a
	// single component; each is written into what its name holds (a
	// symlink is followed, as E2B's envd does), a directory is never
	// replaced (InvalidArgument), and every file operation runs with
	// User's credentials, so no link leads a write where User may not
	// write. A file is written in place (truncated, then written: a
	// watch sees it written), and removed if that fails. Only for an
	// agent with FeatureWriteThrough.
	Through bool `json:"through,omitempty"`
}

// StartedMsg answers an Open whose process started.
type StartedMsg struct {
	PID int `json:"pid"`
}

// ExitMsg ends a channel.
type ExitMsg struct {
	// Code is the exit status; 128+signal for a signalled process, -1 when
	// the process never ran (see Error).
	Code     int    `json:"code"`
	Signal   int    `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	Error    string `json:"error,omitempty"`
	// ErrorClass is an errdefs class name for Error, e.g. "not_found".
	ErrorClass string `json:"error_class,omitempty"`
	// Info carries small results of non-exec ops (JSON).
	Info []byte `json:"info,omitempty"`
}

// InitialWindow is the credit each stream starts with: how many bytes a
// sender may have in flight before the receiver acknowledges them.
const InitialWindow = 1 << 20

// StatInfo is the Info of an OpStatFS exit.
type StatInfo struct {
	Exists bool `json:"exists"`
	IsDir  bool `json:"is_dir"`
}

// MergeEnv joins KEY=VALUE lists in order: a later value of a key replaces
// an earlier one in its place.
func MergeEnv(lists ...[]string) []string {
	var env []string
	idx := map[string]int{}
	for _, l := range lists {
		for _, kv := range l {
			k, _, _ := strings.Cut(kv, "=")
			if i, ok := idx[k]; ok {
				env[i] = kv
				continue
			}
			idx[k] = len(env)
			env = append(env, kv)
		}
	}
	return env
}

// nudgePayload marks the Ping a newly connected host sends before it reads
// the agent's hello (see Nudge).
const nudgePayload = "clade: a new host is connected, say hello"

// Nudge is the frame a host writes as soon as it connects over a virtio
// port: a Ping no old host ever sends. An agent that quiesced for a
// snapshot waits for its old host's hang-up before it says hello (see
// internal/agent/vport.go), and in a VM restored from the snapshot that
// hang-up may never come: the nudge ends the wait at once. An agent in
// session answers it as any Ping, and the host drops a Pong it did not ask
// for.
func Nudge() []byte {
	return append(AppendHeader(nil, Ping, 0, len(nudgePayload)), nudgePayload...)
}
