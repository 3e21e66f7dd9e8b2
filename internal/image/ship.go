package image

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/tarx"
)

// The root stream: how a node ships one of its image roots to another
// (the cluster's GET /v1/internal/roots/{id}), for a root that node lacks:
//
//	uint32 (big-endian) n, then n bytes: the image's descriptor (JSON)
//	frames: uint32 n, then n bytes (1 <= n <= maxFrame) of a tar of the
//	        root (tarx.Create), then a frame of n = 0
//	32 bytes: the SHA-256 of the tar (the frames' bytes, in order)
//	nothing after
//
// Every root is sent this way, whatever made it (a pull's layers, the
// default image's debootstrap, a build's commit): not every root is made
// of layer blobs. Devices, fifos and sockets are left out (tarx.Create);
// sandboxes never see a root's /dev (the engine mounts its own). The
// receiver trusts none of it: the descriptor is bounded and checked by the
// caller before a byte of the tree lands, the tree goes through tarx's
// hostile-archive extraction into a build directory, the stream is bounded
// in bytes and entries, and the digest must match before the root is
// installed; anything refused leaves nothing.

const (
	maxShipDescriptor = 1 << 20
	maxFrame          = 1 << 20
)

// ErrRootStream marks a root stream that is corrupt, cut or over its
// limits.
var ErrRootStream = errors.New("bad image root stream")

// SendRoot writes img's root (with img's descriptor) to w as a root stream.
func (s *Store) SendRoot(ctx context.Context, w io.Writer, img Image) error {
	desc, err := json.Marshal(img)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(desc)))
	if _, err := bw.Write(n[:]); err != nil {
		return err
	}
	if _, err := bw.Write(desc); err != nil {
		return err
	}
	fw := &frameWriter{w: bw, h: sha256.New(), buf: make([]byte, 0, maxFrame)}
	if err := tarx.Create(&ctxWriter{ctx, fw}, img.RootFS, "."); err != nil {
		return err
	}
	if err := fw.flush(); err != nil {
		return err
	}
	binary.BigEndian.PutUint32(n[:], 0)
	if _, err := bw.Write(n[:]); err != nil {
		return err
	}
	if _, err := bw.Write(fw.h.Sum(nil)); err != nil {
		return err
	}
	return bw.Flush()
}

type frameWriter struct {
	w   io.Writer
	h   hash.Hash
	buf []byte
}

func (f *frameWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := min(len(p), maxFrame-len(f.buf))
		f.buf = append(f.buf, p[:k]...)
		p = p[k:]
		if len(f.buf) == maxFrame {
			if err := f.flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

func (f *frameWriter) flush() error {
	if len(f.buf) == 0 {
		return nil
	}
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(f.buf)))
	if _, err := f.w.Write(n[:]); err != nil {
		return err
	}
	if _, err := f.w.Write(f.buf); err != nil {
		return err
	}
	f.h.Write(f.buf)
	f.buf = f.buf[:0]
	return nil
}

type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c *ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}

// ReceiveOptions bound and check a root stream.
type ReceiveOptions struct {
	// MaxBytes bounds the tar's bytes; MaxEntries its entries.
	MaxBytes   int64
	MaxEntries int
	// Check is called with the descriptor before any of the tree is read:
	// its error refuses the stream (the caller checks the identity it
	// asked for).
	Check func(Image) error
}

// ReceiveRoot reads a root stream from r and installs the root under
// .rootfs/ (through OnRoot, as every new root), returning the sent
// descriptor with RootFS naming the new root. Nothing of a stream it
// refuses stays (an InvalidArgument error wrapping ErrRootStream, or the
// Check's); a process killed midway leaves a build directory that the next
// NewStore removes.
func (s *Store) ReceiveRoot(ctx context.Context, r io.Reader, opts ReceiveOptions) (Image, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return Image{}, badStream("its descriptor's length: %v", err)
	}
	size := binary.BigEndian.Uint32(n[:])
	if size == 0 || size > maxShipDescriptor {
		return Image{}, badStream("a descriptor of %d bytes (at most %d)", size, maxShipDescriptor)
	}
	desc := make([]byte, size)
	if _, err := io.ReadFull(r, desc); err != nil {
		return Image{}, badStream("its descriptor: %v", err)
	}
	var img Image
	dec := json.NewDecoder(bytes.NewReader(desc))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&img); err != nil {
		return Image{}, badStream("its descriptor does not parse: %v", err)
	}
	if !ValidName(img.Name) {
		return Image{}, badStream("its descriptor names no valid image (%.70q)", img.Name)
	}
	// As sent, but for where it lives here: the caller checks the
	// identity of these very fields.
	img.RootFS, img.Snapshot = "", ""
	if opts.Check != nil {
		if err := opts.Check(img); err != nil {
			return Image{}, err
		}
	}
	b, err := s.begin("ship")
	if err != nil {
		return Image{}, err
	}
	defer b.close()
	rootfs := filepath.Join(b.dir, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return Image{}, err
	}
	fr := &frameReader{r: r, h: sha256.New(), max: opts.MaxBytes}
	xo := tarx.Options{Chown: true}
	if opts.MaxEntries > 0 {
		xo.Limit = func(n int) error {
			if n > opts.MaxEntries {
				return badStream("more than %d entries", opts.MaxEntries)
			}
			return nil
		}
	}
	if err := tarx.Extract(rootfs, &ctxReader{ctx, fr}, xo); err != nil {
		if fr.err != nil {
			return Image{}, fr.err
		}
		return Image{}, errdefs.Wrap(errdefs.InvalidArgument, fmt.Errorf("%w: %w", ErrRootStream, err))
	}
	// The tar's end padding, then the frame of 0.
	if _, err := io.Copy(io.Discard, &ctxReader{ctx, fr}); err != nil {
		if fr.err != nil {
			return Image{}, fr.err
		}
		return Image{}, err
	}
	var sum [sha256.Size]byte
	if _, err := io.ReadFull(r, sum[:]); err != nil {
		return Image{}, badStream("its digest: %v", err)
	}
	if got := fr.h.Sum(nil); !bytes.Equal(got, sum[:]) {
		return Image{}, badStream("the tree's SHA-256 is %x, the stream says %x", got, sum)
	}
	if k, _ := r.Read(n[:1]); k != 0 {
		return Image{}, badStream("bytes after its end")
	}
	if err := ctx.Err(); err != nil {
		return Image{}, err
	}
	sentRoot := img.Root // part of the descriptor's identity, not a path here
	if img, err = s.commit(b, img); err != nil {
		return Image{}, err
	}
	img.Root = sentRoot
	return img, nil
}

func badStream(format string, args ...any) error {
	return errdefs.Wrap(errdefs.InvalidArgument, fmt.Errorf("%w: %s", ErrRootStream, fmt.Sprintf(format, args...)))
}

// frameReader reads the frames' bytes (hashing them) up to the frame of
// 0, then io.EOF; more than max bytes in all is an error.
type frameReader struct {
	r    io.Reader
	h    hash.Hash
	left uint32 // bytes left in the current frame
	read int64
	max  int64
	done bool
	err  error // the stream's own fault, kept to tell it from the tree's
}

func (f *frameReader) Read(p []byte) (int, error) {
	if f.err != nil {
		return 0, f.err
	}
	if f.done {
		return 0, io.EOF
	}
	if f.left == 0 {
		var n [4]byte
		if _, err := io.ReadFull(f.r, n[:]); err != nil {
			f.err = badStream("cut in its tree: %v", err)
			return 0, f.err
		}
		f.left = binary.BigEndian.Uint32(n[:])
		if f.left == 0 {
			f.done = true
			return 0, io.EOF
		}
		if f.left > maxFrame {
			f.err = badStream("a frame of %d bytes (at most %d)", f.left, maxFrame)
			return 0, f.err
		}
		if f.max > 0 && f.read+int64(f.left) > f.max {
			f.err = errdefs.Wrap(errdefs.InvalidArgument, fmt.Errorf("%w: the root is over the limit of %d bytes", ErrRootStream, f.max))
			return 0, f.err
		}
	}
	if uint32(len(p)) > f.left {
		p = p[:f.left]
	}
	k, err := f.r.Read(p)
	f.h.Write(p[:k])
	f.left -= uint32(k)
	f.read += int64(k)
	if err == io.EOF {
		if f.left > 0 {
			f.err = badStream("cut in its tree")
			return k, f.err
		}
		err = nil
	}
	if err != nil {
		f.err = badStream("%v", err)
		return k, f.err
	}
	return k, nil
}
