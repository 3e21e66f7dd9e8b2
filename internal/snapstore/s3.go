package snapstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/stateimg"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3 is a Store in a bucket of S3-compatible object storage. An image is
// PREFIX/sha256-HEX/ (PREFIX/e-HMAC/ when encrypted, so the bucket does
// not learn the digests): its files as f/0, f/1... in manifest order (no
// names from the image become object keys) and its manifest as m, put
// last: an image is in the store once its m is, and Delete removes m
// first.
type S3 struct {
	cli      *minio.Client
	bucket   string
	prefix   string
	endpoint string
	seal     *sealer // nil: objects are the images' plain bytes
}

var _ Store = (*S3)(nil)

// S3Config says where an S3 store is.
type S3Config struct {
	// Endpoint is the server's URL, http:// or https://.
	Endpoint string
	Bucket   string
	// Prefix is put before every object key (e.g. "clade/").
	Prefix string
	Region string // "us-east-1" if empty
	// AccessKey and SecretKey are the credentials.
	AccessKey, SecretKey string
	// Key, when set (32 bytes), encrypts every object (AES-256-GCM, in
	// the daemon) before it is sent; see crypt.go.
	Key []byte
	// CreateBucket makes the bucket when it does not exist.
	CreateBucket bool
}

// ParseURL reads s3://BUCKET[/PREFIX]?endpoint=URL[&region=R] into a
// config without credentials.
func ParseURL(s string) (S3Config, error) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "s3" || u.Host == "" {
		return S3Config{}, errdefs.New(errdefs.InvalidArgument, "object store %q: want s3://BUCKET[/PREFIX]?endpoint=http(s)://HOST:PORT", s)
	}
	q := u.Query()
	ep := q.Get("endpoint")
	eu, err := url.Parse(ep)
	if ep == "" || err != nil || (eu.Scheme != "http" && eu.Scheme != "https") || eu.Host == "" {
		return S3Config{}, errdefs.New(errdefs.InvalidArgument, "object store %q: endpoint=%q must be an http:// or https:// URL of the S3 server", s, ep)
	}
	for k := range q {
		if k != "endpoint" && k != "region" {
			return S3Config{}, errdefs.New(errdefs.InvalidArgument, "object store %q: unknown parameter %q (endpoint, region)", s, k)
		}
	}
	prefix := strings.Trim(u.Path, "/")
	if prefix != "" {
		prefix += "/"
	}
	return S3Config{Endpoint: ep, Bucket: u.Host, Prefix: prefix, Region: q.Get("region")}, nil
}

// NewS3 connects to the store and checks that its bucket is there (making
// it when CreateBucket is set). An unreachable server is errdefs.Unavailable.
func NewS3(ctx context.Context, cfg S3Config) (*S3, error) {
	eu, err := url.Parse(cfg.Endpoint)
	if err != nil || eu.Host == "" {
		return nil, errdefs.New(errdefs.InvalidArgument, "object store endpoint %q is not a URL", cfg.Endpoint)
	}
	if cfg.AccessKey == "" || cfg.SecretKey == "" {
		return nil, errdefs.New(errdefs.InvalidArgument, "object store %s: no credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or --object-store-credentials FILE)", cfg.Endpoint)
	}
	region := cfg.Region
	if region == "" {
		region = "us-east-1"
	}
	cli, err := minio.New(eu.Host, &minio.Options{
		Creds:        credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure:       eu.Scheme == "https",
		Region:       region,
		BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		return nil, errdefs.New(errdefs.InvalidArgument, "object store %s: %v", cfg.Endpoint, err)
	}
	s := &S3{cli: cli, bucket: cfg.Bucket, prefix: cfg.Prefix, endpoint: cfg.Endpoint}
	if cfg.Key != nil {
		if s.seal, err = newSealer(cfg.Key); err != nil {
			return nil, err
		}
	}
	ok, err := cli.BucketExists(ctx, cfg.Bucket)
	if err != nil {
		return nil, s.unavailable("check bucket "+cfg.Bucket, err)
	}
	if !ok {
		if !cfg.CreateBucket {
			return nil, errdefs.New(errdefs.InvalidArgument, "object store %s has no bucket %q: make it first", cfg.Endpoint, cfg.Bucket)
		}
		if err := cli.MakeBucket(ctx, cfg.Bucket, minio.MakeBucketOptions{Region: region}); err != nil {
			return nil, s.unavailable("make bucket "+cfg.Bucket, err)
		}
	}
	return s, nil
}

// KeyID says which key the store's objects are sealed under: "plain"
// without one, else "sealed:" and an identifier of the key (not the key).
// Two daemons open each other's objects only when their KeyIDs are equal.
func (s *S3) KeyID() string {
	if s.seal == nil {
		return KeyPlain
	}
	return s.seal.id()
}

func (s *S3) unavailable(what string, err error) error {
	return errdefs.Wrap(errdefs.Unavailable, fmt.Errorf("object store %s: %s: %w", s.endpoint, what, err))
}

func (s *S3) base(d Digest) string {
	if s.seal != nil {
		return s.prefix + s.seal.prefix(d) + "/"
	}
	return s.prefix + "sha256-" + d.hex() + "/"
}

func noSuchKey(err error) bool {
	return minio.ToErrorResponse(err).Code == "NoSuchKey"
}

// put stores one object of size plaintext bytes from r.
func (s *S3) put(ctx context.Context, key string, r io.Reader, size int64) error {
	if s.seal != nil {
		er, err := s.seal.encrypt(r, size, key)
		if err != nil {
			return err
		}
		r, size = er, sealedSize(size)
	}
	_, err := s.cli.PutObject(ctx, s.bucket, key, r, size, minio.PutObjectOptions{
		ContentType: "application/octet-stream", PartSize: 16 << 20, NumThreads: 4,
	})
	if err != nil {
		return s.unavailable("put "+key, err)
	}
	return nil
}

// get opens one object's plaintext; a missing object is fs.ErrNotExist.
func (s *S3) get(ctx context.Context, key string) (io.ReadCloser, error) {
	obj, err := s.cli.GetObject(ctx, s.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, s.unavailable("get "+key, err)
	}
	// GetObject is lazy: Stat makes the request and reports a missing key.
	if _, err := obj.Stat(); err != nil {
		obj.Close()
		if noSuchKey(err) {
			return nil, os.ErrNotExist
		}
		return nil, s.unavailable("get "+key, err)
	}
	if s.seal == nil {
		return obj, nil
	}
	dr, err := s.seal.decrypt(obj, key)
	if err != nil {
		obj.Close()
		if !errors.Is(err, errSealed) {
			return nil, s.unavailable("get "+key, err) // the read, not the object
		}
		return nil, err
	}
	return readCloser{dr, obj}, nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

// manifest reads and checks an image's manifest.
func (s *S3) manifest(ctx context.Context, d Digest) ([]stateimg.File, error) {
	r, err := s.get(ctx, s.base(d)+"m")
	if errors.Is(err, os.ErrNotExist) {
		if s.seal != nil {
			// Its objects' names are keyed too: an image sealed under
			// another key is not found rather than refused.
			return nil, errdefs.New(errdefs.NotFound, "stored image %s not found in %s under this daemon's key (%s): it is not there, or it was sealed under another host key (every node must have the same --key-file or $CLADE_KEY)", short(d), s.endpoint, s.seal.id())
		}
		return nil, errdefs.New(errdefs.NotFound, "stored image %s not found in %s", short(d), s.endpoint)
	}
	if errors.Is(err, errSealed) {
		return nil, corrupt(d, "its manifest: %v", err)
	}
	if err != nil {
		return nil, err
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, 64<<20))
	if errors.Is(err, errSealed) {
		return nil, corrupt(d, "its manifest: %v", err)
	}
	if err != nil {
		return nil, s.unavailable("read manifest", err)
	}
	if digestBytes(b) != d {
		return nil, corrupt(d, "its manifest does not match its digest")
	}
	files, err := stateimg.ParseManifest(b)
	if err != nil {
		return nil, corrupt(d, "%v", err)
	}
	return files, nil
}

// Put implements Store.
func (s *S3) Put(ctx context.Context, dir string) (Info, error) {
	mb, d, files, err := sealedForPut(dir)
	if err != nil {
		return Info{}, err
	}
	if in, err := s.Stat(ctx, d); err == nil {
		return in, nil
	}
	base := s.base(d)
	for i, f := range files {
		fh, err := os.Open(filepath.Join(dir, filepath.FromSlash(f.Name)))
		if err != nil {
			return Info{}, fmt.Errorf("put %s: %w", dir, err)
		}
		err = s.put(ctx, base+"f/"+strconv.Itoa(i), fh, f.Size)
		fh.Close()
		if err != nil {
			return Info{}, fmt.Errorf("put %s: %w", dir, err)
		}
	}
	if err := s.put(ctx, base+"m", bytes.NewReader(mb), int64(len(mb))); err != nil {
		return Info{}, fmt.Errorf("put %s: %w", dir, err)
	}
	return infoOf(d, files), nil
}

// Fetch implements Store.
func (s *S3) Fetch(ctx context.Context, d Digest, dir string) error {
	if _, err := Parse(string(d)); err != nil {
		return err
	}
	if ok, err := existingCopy(d, dir); ok || err != nil {
		return err
	}
	files, err := s.manifest(ctx, d)
	if err != nil {
		return err
	}
	tmp, err := tempDir(dir)
	if err != nil {
		return err
	}
	fail := func(err error) error { return errors.Join(err, os.RemoveAll(tmp)) }
	base := s.base(d)
	for i, f := range files {
		if err := s.fetchFile(ctx, d, base+"f/"+strconv.Itoa(i), f, filepath.Join(tmp, filepath.FromSlash(f.Name))); err != nil {
			return fail(err)
		}
	}
	mf, err := s.get(ctx, base+"m")
	if err != nil {
		return fail(err)
	}
	mb, err := io.ReadAll(io.LimitReader(mf, 64<<20))
	mf.Close()
	if err != nil || digestBytes(mb) != d {
		return fail(corrupt(d, "its manifest changed while it was fetched"))
	}
	if err := os.WriteFile(filepath.Join(tmp, stateimg.ManifestName), mb, 0o600); err != nil {
		return fail(err)
	}
	return finish(d, tmp, dir)
}

func (s *S3) fetchFile(ctx context.Context, d Digest, key string, f stateimg.File, dst string) error {
	r, err := s.get(ctx, key)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return corrupt(d, "%s is missing from the store", f.Name)
	case errors.Is(err, errSealed):
		return corrupt(d, "%s: %v", f.Name, err)
	case err != nil:
		return err
	}
	defer r.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	// One byte past the recorded size says the object is too long.
	n, err := writeSparse(out, io.LimitReader(r, f.Size+1))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	switch {
	case errors.Is(err, errSealed):
		return corrupt(d, "%s: %v", f.Name, err)
	case err != nil:
		return s.unavailable("get "+f.Name, err)
	case n != f.Size:
		return corrupt(d, "%s has %d bytes in the store, expected %d", f.Name, min(n, f.Size+1), f.Size)
	}
	return nil
}

// writeSparse copies r to f leaving holes for zero blocks (a VM's RAM
// file is mostly holes), and returns the bytes copied.
func writeSparse(f *os.File, r io.Reader) (int64, error) {
	const block = 64 << 10
	buf := make([]byte, 1<<20)
	var off int64
	for {
		n, err := io.ReadFull(r, buf)
		for b := 0; b < n; b += block {
			chunk := buf[b:min(b+block, n)]
			if isZero(chunk) {
				continue
			}
			if _, werr := f.WriteAt(chunk, off+int64(b)); werr != nil {
				return off, werr
			}
		}
		off += int64(n)
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return off, f.Truncate(off)
		}
		if err != nil {
			return off, err
		}
	}
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// Stat implements Store.
func (s *S3) Stat(ctx context.Context, d Digest) (Info, error) {
	if _, err := Parse(string(d)); err != nil {
		return Info{}, err
	}
	files, err := s.manifest(ctx, d)
	if err != nil {
		return Info{}, err
	}
	return infoOf(d, files), nil
}

// Delete implements Store.
func (s *S3) Delete(ctx context.Context, d Digest) error {
	if _, err := Parse(string(d)); err != nil {
		return err
	}
	base := s.base(d)
	if err := s.cli.RemoveObject(ctx, s.bucket, base+"m", minio.RemoveObjectOptions{}); err != nil && !noSuchKey(err) {
		return s.unavailable("delete "+short(d), err)
	}
	objs := s.cli.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: base, Recursive: true})
	var errs, listErrs []error
	ch := make(chan minio.ObjectInfo)
	go func() {
		defer close(ch)
		for o := range objs {
			if o.Err != nil {
				listErrs = append(listErrs, s.unavailable("list "+short(d), o.Err))
				continue
			}
			ch <- o
		}
	}()
	for e := range s.cli.RemoveObjects(ctx, s.bucket, ch, minio.RemoveObjectsOptions{}) {
		if !noSuchKey(e.Err) {
			errs = append(errs, s.unavailable("delete "+e.ObjectName, e.Err))
		}
	}
	// RemoveObjects has drained ch: the lister is done with listErrs.
	return errors.Join(append(errs, listErrs...)...)
}

// Probe writes, reads back and deletes a small object: the store takes
// writes. An error is errdefs.Unavailable.
func (s *S3) Probe(ctx context.Context) error {
	key := s.prefix + ".probe"
	if err := s.put(ctx, key, strings.NewReader("ok"), 2); err != nil {
		return err
	}
	r, err := s.get(ctx, key)
	if err != nil {
		return s.unavailable("probe", err)
	}
	b, err := io.ReadAll(r)
	r.Close()
	if err != nil || string(b) != "ok" {
		return s.unavailable("probe", fmt.Errorf("read back %q, %v", b, err))
	}
	if err := s.cli.RemoveObject(ctx, s.bucket, key, minio.RemoveObjectOptions{}); err != nil {
		return s.unavailable("probe", err)
	}
	return nil
}

// Key returns the object key prefix under which s keeps image d (what a
// cluster directory records as the image's place).
func (s *S3) Key(d Digest) string { return s.base(d) }
