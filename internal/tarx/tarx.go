// Package tarx creates and extracts the tar streams behind clade's cp.
//
// Archives come from untrusted parties (a client, or a sandbox that may be
// compromised), so extraction treats every header as hostile: it never writes
// outside its destination, never writes through a symlink, and refuses entry
// types a copy has no business creating.
package tarx

// MaxEntrySize bounds one entry so a hostile header cannot ask for an
// unbounded write.
const MaxEntrySize = 16 << 30

// maxNameLen is Linux's PATH_MAX: longer names cannot be created anyway.
const maxNameLen = 4096

// Options tune extraction.
type Options struct {
	// Chown applies the uid and gid from the headers. It only takes effect
	// when running as root; otherwise entries are owned by the caller.
	Chown bool
}
