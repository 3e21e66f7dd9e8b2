package cluster

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/stateimg"
)

// The image stream of GET /v1/internal/snapshots/{digest}: the manifest's
// length (4 bytes, big-endian) and bytes, then each file the manifest
// lists, in its order, exactly its size, and nothing after. The receiver
// trusts none of it: the manifest must hash to the digest asked for, its
// names must be plain relative paths, each file must be exactly its size,
// and the import verifies every file's checksum before a restore.

// maxManifest bounds the manifest a peer may send.
const maxManifest = 16 << 20

// sendImage writes the sealed image in dir to w.
func sendImage(w io.Writer, dir string) error {
	b, files, err := stateimg.ReadManifest(dir)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(b)))
	if _, err := bw.Write(n[:]); err != nil {
		return err
	}
	if _, err := bw.Write(b); err != nil {
		return err
	}
	for _, f := range files {
		if err := sendFile(bw, filepath.Join(dir, filepath.FromSlash(f.Name)), f.Size); err != nil {
			return err
		}
	}
	return bw.Flush()
}

func sendFile(w io.Writer, path string, size int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	got, err := io.Copy(w, io.LimitReader(f, size))
	if err == nil && got != size {
		err = fmt.Errorf("%s has %d bytes, its manifest %d", path, got, size)
	}
	return err
}

// receiveImage reads an image stream into dir (made here; it must not
// exist) and checks it against digest ("sha256:HEX" of its manifest). On
// any error dir is removed.
func receiveImage(r io.Reader, digest, dir string) (err error) {
	corrupt := func(format string, args ...any) error {
		return errdefs.Wrap(errdefs.Conflict, fmt.Errorf("%w: the image %.19s sent: %s", stateimg.ErrCorrupt, digest, fmt.Sprintf(format, args...)))
	}
	br := bufio.NewReaderSize(r, 1<<20)
	var n [4]byte
	if _, err := io.ReadFull(br, n[:]); err != nil {
		return corrupt("no manifest: %v", err)
	}
	ml := binary.BigEndian.Uint32(n[:])
	if ml == 0 || ml > maxManifest {
		return corrupt("a manifest of %d bytes", ml)
	}
	b := make([]byte, ml)
	if _, err := io.ReadFull(br, b); err != nil {
		return corrupt("the manifest is cut short: %v", err)
	}
	sum := sha256.Sum256(b)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != digest {
		return corrupt("its manifest hashes to %.19s", got)
	}
	files, err := stateimg.ParseManifest(b)
	if err != nil {
		return corrupt("%v", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, os.RemoveAll(dir))
		}
	}()
	if err := os.WriteFile(filepath.Join(dir, stateimg.ManifestName), b, 0o600); err != nil {
		return err
	}
	for _, f := range files {
		p := filepath.Join(dir, filepath.FromSlash(f.Name))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return err
		}
		got, err := receiveFile(br, p, f.Size)
		if err != nil {
			return err
		}
		if got != f.Size {
			return corrupt("%s: %d bytes of %d: %v", f.Name, got, f.Size, errShortImage)
		}
	}
	if _, err := br.ReadByte(); err != io.EOF {
		return corrupt("bytes past the last file")
	}
	return nil
}

// receiveFile writes the next size bytes of r to a new file at p, leaving
// holes for zero blocks (a memory image is mostly zeros).
func receiveFile(r io.Reader, p string, size int64) (int64, error) {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, err
	}
	const block = 64 << 10
	buf := make([]byte, 1<<20)
	lr := io.LimitReader(r, size)
	var off int64
	for {
		k, rerr := io.ReadFull(lr, buf)
		for b := 0; b < k; b += block {
			chunk := buf[b:min(b+block, k)]
			if allZero(chunk) {
				continue
			}
			if _, err := f.WriteAt(chunk, off+int64(b)); err != nil {
				f.Close()
				return off, err
			}
		}
		off += int64(k)
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			f.Close()
			return off, rerr
		}
	}
	if err := f.Truncate(off); err != nil {
		f.Close()
		return off, err
	}
	return off, f.Close()
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
