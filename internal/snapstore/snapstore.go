// Package snapstore keeps sealed state images (snapshots, sleep images)
// somewhere other than the directory an engine wrote them to: a local
// directory or S3-compatible object storage, so another node (or this one,
// after its local copy is gone) can fetch an image by its digest and
// restore it. Engines keep working on local directories; a Store copies
// whole sealed images in and out of them.
//
// The unit is a stateimg image: a directory with its manifest. An image is
// addressed by the SHA-256 of its manifest's bytes (the manifest lists
// every file's size and CRC-32C), and every fetched image is verified
// against its manifest before Fetch returns: a corrupt, truncated or
// swapped object is an error, never a restorable directory.
package snapstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/stateimg"
)

// Store holds sealed state images by digest.
type Store interface {
	// Put copies the sealed image in dir into the store and returns its
	// info. dir must be sealed and verify (a corrupt image is refused
	// with a stateimg.ErrCorrupt error, nothing stored). Putting an
	// image the store already holds is a no-op. An image is visible to
	// Stat and Fetch only once all of it is stored: a Put that fails or
	// is killed midway leaves nothing Fetch would use.
	Put(ctx context.Context, dir string) (Info, error)
	// Fetch writes the image with digest into dir, which must not exist
	// (its parent must), verified against its manifest first: a missing
	// image is errdefs.NotFound, a corrupt or truncated one an error
	// wrapping stateimg.ErrCorrupt (class Conflict), and in both cases
	// dir is not made. dir already holding that very image, intact, is
	// not an error.
	Fetch(ctx context.Context, digest Digest, dir string) error
	// Stat returns the info of a stored image, errdefs.NotFound if the
	// store does not hold it (or holds only part of it).
	Stat(ctx context.Context, digest Digest) (Info, error)
	// Delete removes an image. Deleting one the store does not hold
	// returns nil.
	Delete(ctx context.Context, digest Digest) error
}

// Has reports whether s holds the image with digest.
func Has(ctx context.Context, s Store, digest Digest) (bool, error) {
	_, err := s.Stat(ctx, digest)
	if errdefs.Is(err, errdefs.NotFound) {
		return false, nil
	}
	return err == nil, err
}

// Digest names an image: "sha256:" and the hex SHA-256 of its manifest.
type Digest string

// Info describes a stored image.
type Info struct {
	Digest Digest
	Files  int
	Size   int64 // the files' bytes, the manifest aside
}

// DigestOf returns the digest of the sealed image in dir (reading only its
// manifest) and its files.
func DigestOf(dir string) (Digest, []stateimg.File, error) {
	b, files, err := stateimg.ReadManifest(dir)
	if err != nil {
		return "", nil, err
	}
	return digestBytes(b), files, nil
}

func digestBytes(manifest []byte) Digest {
	sum := sha256.Sum256(manifest)
	return Digest("sha256:" + hex.EncodeToString(sum[:]))
}

// Parse checks that s is a well-formed digest.
func Parse(s string) (Digest, error) {
	hexPart, ok := strings.CutPrefix(s, "sha256:")
	if !ok || len(hexPart) != 64 || strings.ToLower(hexPart) != hexPart {
		return "", errdefs.New(errdefs.InvalidArgument, "%q is not a state image digest (sha256:<64 hex digits>)", s)
	}
	if _, err := hex.DecodeString(hexPart); err != nil {
		return "", errdefs.New(errdefs.InvalidArgument, "%q is not a state image digest (sha256:<64 hex digits>)", s)
	}
	return Digest(s), nil
}

func (d Digest) hex() string { return strings.TrimPrefix(string(d), "sha256:") }

func infoOf(d Digest, files []stateimg.File) Info {
	in := Info{Digest: d, Files: len(files)}
	for _, f := range files {
		in.Size += f.Size
	}
	return in
}

// sealedForPut checks that dir is an intact sealed image and returns its
// manifest bytes, digest and files.
func sealedForPut(dir string) ([]byte, Digest, []stateimg.File, error) {
	if err := stateimg.Verify(dir); err != nil {
		return nil, "", nil, fmt.Errorf("put %s: %w", dir, err)
	}
	b, files, err := stateimg.ReadManifest(dir)
	if err != nil {
		return nil, "", nil, fmt.Errorf("put %s: %w", dir, err)
	}
	return b, digestBytes(b), files, nil
}

// corrupt is the error for a stored image that is not what its digest
// names.
func corrupt(d Digest, format string, args ...any) error {
	return errdefs.Wrap(errdefs.Conflict, fmt.Errorf("stored image %s: %w: %s", short(d), stateimg.ErrCorrupt, fmt.Sprintf(format, args...)))
}

func short(d Digest) string {
	h := d.hex()
	if len(h) > 12 {
		h = h[:12]
	}
	return "sha256:" + h
}

// existingCopy reports whether dir already holds the intact image d (a
// Fetch into a warm cache), and errors for a dir that holds anything else.
func existingCopy(d Digest, dir string) (bool, error) {
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	if got, _, err := DigestOf(dir); err == nil && got == d && stateimg.Verify(dir) == nil {
		return true, nil
	}
	return false, errdefs.New(errdefs.AlreadyExists, "fetch %s: %s exists and is not that image", short(d), dir)
}

// finish verifies the image fetched into tmp and renames it to dir; on
// any error tmp is removed.
func finish(d Digest, tmp, dir string) error {
	if err := stateimg.VerifyAs(tmp, "stored image "+short(d)); err != nil {
		return errors.Join(err, os.RemoveAll(tmp))
	}
	if err := os.Rename(tmp, dir); err != nil {
		return errors.Join(fmt.Errorf("fetch %s: %w", short(d), err), os.RemoveAll(tmp))
	}
	return nil
}

// tempDir makes a fresh directory beside dir to fetch into.
func tempDir(dir string) (string, error) {
	return os.MkdirTemp(filepath.Dir(dir), "."+filepath.Base(dir)+".fetch-")
}

func (d Digest) String() string { return string(d) }
