// Package tarx creates and extracts the tar streams behind clade's cp, and
// holds the one tar walker (Walk) that both cp's extraction and the image
// layer applier (internal/image) use, each with its own Policy for where an
// entry goes.
//
// Archives come from untrusted parties (a client, a registry, or a sandbox
// that may be compromised), so the walker treats every header as hostile: it
// never writes outside its destination, never writes through what an entry
// replaces, and refuses entry types neither a copy nor an image has any
// business creating. Extract's policy is stricter still: it never writes
// through a symlink at all.
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
	// Limit, when set, is called with each entry's number (from 1) before
	// the entry is extracted; an error it returns ends the extraction as
	// it is (what came before stays).
	Limit func(n int) error
}
