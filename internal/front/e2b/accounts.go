package e2b

import (
	"sync"
	"time"

	"github.com/clade-sandbox/clade/api"
)

// accountReady is what userSetup prints when the root it ran on holds
// E2B's account already.
const accountReady = "clade-e2b-account-ready"

// maxAccountRoots bounds the roots remembered (images and snapshots are
// few; a client naming many snapshots only costs the setup again).
const maxAccountRoots = 1024

// accounts remembers the roots (an image as installed, a snapshot) whose
// sandboxes hold E2B's account already: user `user`, uid 1000, its home
// owned by it, as E2B's base has it (the e2b-base image). A new sandbox's
// files are its root's, so one setup that found nothing to do stands for
// every later sandbox of that root, and their creates run no setup at
// all: without it, each create ran a shell in the sandbox (~200 ms on a
// loaded host, most of an E2B create of a hot sandbox).
//
// A root is an image as it was installed (its name, install time and
// digest: a rebuilt or replaced image is another root) or a snapshot (by
// id: its files never change). The image is looked up just before the
// create; an image replaced in between (microseconds) could give one
// sandbox the new root under the old one's key, which is why a key is
// only ever learnt from a setup that found the account.
type accounts struct {
	mu    sync.Mutex
	roots map[string]bool
}

// ready reports whether root is known to hold the account ("" is no root).
func (a *accounts) ready(root string) bool {
	if root == "" {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.roots[root]
}

// learn records that root holds the account.
func (a *accounts) learn(root string) {
	if root == "" {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.roots == nil || len(a.roots) >= maxAccountRoots {
		a.roots = map[string]bool{}
	}
	a.roots[root] = true
}

// imageRoot is the key of img as installed.
func imageRoot(img api.Image) string {
	return "image:" + img.Name + "@" + img.CreatedAt.UTC().Format(time.RFC3339Nano) + "/" + img.ManifestDigest + "/" + img.Snapshot
}

// snapshotRoot is the key of snapshot sn.
func snapshotRoot(sn api.Snapshot) string { return "snapshot:" + sn.ID }
