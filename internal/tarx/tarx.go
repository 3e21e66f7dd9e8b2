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
	// FollowDest makes ExtractTo treat a symlink at its destination as the
	// directory it points to, as `docker cp` does. Leave it unset wherever
	// an earlier extraction from the same untrusted source may have made
	// that symlink (a copy out of a sandbox onto the host): a first copy
	// could plant the destination as a link to any directory and a second
	// one would then write there. Inside a sandbox, which is its own
	// boundary, the agent sets it.
	FollowDest bool
	// Top, when set, is the one top-level name ExtractTo accepts when it
	// extracts into an existing directory: the base name of what was
	// copied, so a copy of box:/out into ~ can only make ~/out, never
	// ~/.bashrc. A name outside it is an InvalidArgument error.
	Top string
	// Owner, when set with Chown, owns every entry instead of the uid and
	// gid of the headers: an upload made for one user.
	Owner *Owner
}

// Owner is a uid and gid.
type Owner struct{ UID, GID int }
