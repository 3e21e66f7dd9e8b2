package guest

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/clade-sandbox/clade/internal/agent/wire"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// Every process in a sandbox runs as root there and can reach the agent's
// socket, so a connection to it proves nothing. What does is the agent's
// key: random bytes the host hands the agent over its connection (a Key
// frame) and the agent keeps in its memory only (no file, no environment;
// it is not dumpable and the sandbox's processes lack CAP_SYS_PTRACE, so
// none can read it there), presented in every hello.
//
// The agent of a fresh boot has no key yet: its first hello is taken on
// trust, which is sound while the agent is the only process in the
// sandbox, that is until the host opens its first channel (the agent
// starts nothing before). A restored agent presents its snapshot's key,
// which every copy restored from that snapshot holds: the first hello
// with it gets a key of the sandbox's own, so no fork child can speak for
// another. Until the agent acknowledges a new key the host accepts the
// ones before it too, so a connection lost in between does not lock the
// agent out.

// Auth says which keys a Conn accepts from its agent.
type Auth struct {
	// Keys are the keys the agent may present, the current one first.
	Keys [][]byte
	// Fresh says the sandbox boots afresh: its agent's first hello, which
	// has no key, is taken on trust until the first channel opens (what
	// NewConn does).
	Fresh bool
	// Restored says the keys are a snapshot's (see Conn.Keys), which
	// every sandbox restored from it holds: the agent that presents one is
	// handed a key of the sandbox's own at once.
	Restored bool
	// Save, if set, is called with the keys the Conn accepts, the current
	// one first, whenever they change, before the agent learns a new one
	// (the engine keeps them for a daemon that restarts). An error refuses
	// that connection; the agent redials.
	Save func(keys [][]byte) error
	// Legacy accepts an agent that does not authenticate: the sandbox or
	// snapshot predates agent keys (made by an older clade), so its agent
	// cannot prove itself, and refusing it would lose the sandbox. Such a
	// sandbox is as open to an impostor inside it as it was before; the
	// daemon survives one either way. Recreating the sandbox ends it.
	Legacy bool
}

// maxOldKeys bounds the keys accepted besides the current one.
const maxOldKeys = 4

// ErrRejected marks a connection refused because it did not prove to be
// the sandbox's agent: something else inside the sandbox dialled the
// agent's socket. It is of class Unauthenticated.
var ErrRejected = errdefs.New(errdefs.Unauthenticated, "not the sandbox's agent")

// IsRejected reports whether Serve refused a connection for not proving to
// be the sandbox's agent (ErrRejected).
func IsRejected(err error) bool { return errors.Is(err, ErrRejected) }

// Authenticate replaces what c accepts from its agent. Without it a Conn
// takes its agent's first hello on trust (a fresh boot, see above); call
// it before the agent can connect (a restore, a daemon that reattaches).
func (c *Conn) Authenticate(a Auth) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.trustFirst = a.Fresh
	c.legacy = a.Legacy
	c.key = nil
	c.oldKeys = nil
	for _, k := range a.Keys {
		if len(k) == 0 {
			continue
		}
		k = slices.Clone(k)
		if c.key == nil && !a.Restored {
			c.key = k
		} else {
			c.oldKeys = append(c.oldKeys, k)
		}
	}
	c.save = a.Save
}

// Keys returns the keys c accepts from its agent, the current one first:
// what a snapshot of the sandbox taken now holds (see Auth.Restored).
func (c *Conn) Keys() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.keysLocked()
}

func (c *Conn) keysLocked() [][]byte {
	var keys [][]byte
	if c.key != nil {
		keys = append(keys, slices.Clone(c.key))
	}
	for _, k := range c.oldKeys {
		keys = append(keys, slices.Clone(k))
	}
	return keys
}

// admitLocked checks hello's proof. It returns the new key to hand the
// agent (saved, and accepted from now on), nil when the agent keeps its
// own, or ErrRejected.
func (c *Conn) admitLocked(h wire.HelloMsg) ([]byte, error) {
	if !slices.Contains(h.Features, wire.FeatureAuth) {
		if c.legacy {
			return nil, nil
		}
		return nil, fmt.Errorf("%w: the agent does not authenticate (an agent older than the host's? rebuild the snapshot)", ErrRejected)
	}
	switch {
	case len(h.Key) == 0:
		if !c.trustFirst {
			return nil, fmt.Errorf("%w: a hello without a key", ErrRejected)
		}
	case c.key != nil && subtle.ConstantTimeCompare(h.Key, c.key) == 1:
		// It holds the current key: as good as an acknowledgement.
		c.forgetOldLocked()
		return nil, nil
	default:
		known := false
		for _, k := range c.oldKeys {
			if subtle.ConstantTimeCompare(h.Key, k) == 1 {
				known = true
			}
		}
		if !known {
			return nil, fmt.Errorf("%w: a hello with a wrong key", ErrRejected)
		}
	}
	key := make([]byte, wire.KeySize)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	old := c.oldKeys
	if c.key != nil {
		old = append([][]byte{c.key}, old...)
	}
	old = old[:min(len(old), maxOldKeys)]
	if c.save != nil {
		if err := c.save(append([][]byte{key}, old...)); err != nil {
			return nil, fmt.Errorf("save the agent's key: %w", err)
		}
	}
	c.key, c.oldKeys = key, old
	return key, nil
}

// keyAcked is told that the agent of s holds the current key: only that one
// is accepted from now on.
func (c *Conn) keyAcked(s *session) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == s {
		c.forgetOldLocked()
	}
}

// forgetOldLocked accepts only the current key from now on.
func (c *Conn) forgetOldLocked() {
	if len(c.oldKeys) == 0 && !c.trustFirst {
		return
	}
	c.oldKeys, c.trustFirst = nil, false
	if c.save != nil {
		// A failure leaves the old keys saved too: still only keys the
		// sandbox's own agent held.
		_ = c.save(c.keysLocked())
	}
}

// KeyFile is the name engines give the file that holds a sandbox's (or a
// snapshot's) agent keys, in a directory of the host that the sandbox does
// not see. A snapshot's memory holds its agent's key anyway.
const KeyFile = "agent.key"

// WriteKeys writes keys to path (mode 0600), replacing it whole.
func WriteKeys(path string, keys [][]byte) error {
	var b []byte
	for _, k := range keys {
		b = hex.AppendEncode(b, k)
		b = append(b, '\n')
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ReadKeys reads what WriteKeys wrote. A file that is not there is a
// NotFound error.
func ReadKeys(path string) ([][]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errdefs.Wrap(errdefs.NotFound, fmt.Errorf("agent keys: %w", err))
	}
	if err != nil {
		return nil, err
	}
	var keys [][]byte
	for line := range strings.FieldsSeq(string(b)) {
		k, err := hex.DecodeString(line)
		if err != nil || len(k) != wire.KeySize {
			return nil, fmt.Errorf("agent keys %s: a malformed line", path)
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// LoadKeys reads the keys at path for an Auth: a file that is not there
// is a sandbox or snapshot older than agent keys, whose agent is accepted
// without one (legacy, see Auth.Legacy).
func LoadKeys(path string) (keys [][]byte, legacy bool, err error) {
	keys, err = ReadKeys(path)
	if errdefs.IsNotFound(err) {
		return nil, true, nil
	}
	return keys, false, err
}

// KeySaver returns an Auth.Save that keeps the keys in path (WriteKeys).
func KeySaver(path string) func([][]byte) error {
	return func(keys [][]byte) error { return WriteKeys(path, keys) }
}
