package snapstore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/snapstore"
	"github.com/clade-sandbox/clade/internal/snapstore/storetest"
	"github.com/clade-sandbox/clade/internal/snapstore/weedtest"
	"github.com/clade-sandbox/clade/internal/stateimg"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

var bucketN int

func newBucket(t *testing.T, srv *weedtest.Server, key []byte) (*snapstore.S3, string) {
	bucketN++
	bucket := "bucket-" + strconv.Itoa(bucketN)
	cfg := srv.Config(bucket)
	cfg.Key = key
	s, err := snapstore.NewS3(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, bucket
}

func rawClient(t *testing.T, srv *weedtest.Server) *minio.Client {
	u, _ := url.Parse(srv.Endpoint)
	c, err := minio.New(u.Host, &minio.Options{Creds: credentials.NewStaticV4(srv.AccessKey, srv.SecretKey, ""), Region: "us-east-1", BucketLookup: minio.BucketLookupPath})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// damageObject damages one stored object. storetest damages pages.img,
// f/2 in the manifest's sorted order of MakeImage's files (empty,
// meta/checkpoint.json, pages.img).
func damageObject(t *testing.T, c *minio.Client, bucket, key string, how storetest.Damage) {
	ctx := t.Context()
	switch how {
	case storetest.Drop:
		if err := c.RemoveObject(ctx, bucket, key, minio.RemoveObjectOptions{}); err != nil {
			t.Fatal(err)
		}
		return
	}
	obj, err := c.GetObject(ctx, bucket, key, minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(obj)
	obj.Close()
	if err != nil {
		t.Fatal(err)
	}
	if how == storetest.Flip {
		b[len(b)-100] ^= 0x55
	} else {
		b = b[:len(b)/2]
	}
	if _, err := c.PutObject(ctx, bucket, key, bytes.NewReader(b), int64(len(b)), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestS3(t *testing.T) {
	t.Parallel() // a weed of its own: its start (~13 s) overlaps another test's
	srv := weedtest.Start(t)
	raw := rawClient(t, srv)
	for _, enc := range []bool{false, true} {
		t.Run(fmt.Sprintf("encrypted=%v", enc), func(t *testing.T) {
			var key []byte
			if enc {
				key = make([]byte, 32)
				_, _ = rand.Read(key)
			}
			storetest.Run(t, func(t *testing.T) storetest.Harness {
				s, bucket := newBucket(t, srv, key)
				return storetest.Harness{Store: s, Damage: func(t *testing.T, d snapstore.Digest, name string, how storetest.Damage) {
					damageObject(t, raw, bucket, s.Key(d)+"f/2", how)
				}}
			})
		})
	}
}

// With a key, no byte of an image reaches the object store in the clear,
// and another key cannot open it; without one, the same scan finds the
// marker (so the scan would see it).
func TestS3Encryption(t *testing.T) {
	t.Parallel() // a weed of its own: its start (~13 s) overlaps another test's
	srv := weedtest.Start(t)
	raw := rawClient(t, srv)
	marker := []byte("clade-marker-" + strconv.FormatInt(time.Now().UnixNano(), 36))
	img := t.TempDir()
	if err := os.WriteFile(filepath.Join(img, "pages.img"), bytes.Repeat(marker, 100000), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := stateimg.Seal(img); err != nil {
		t.Fatal(err)
	}
	scan := func(bucket string) (found bool, keys []string) {
		for o := range raw.ListObjects(t.Context(), bucket, minio.ListObjectsOptions{Recursive: true}) {
			if o.Err != nil {
				t.Fatal(o.Err)
			}
			keys = append(keys, o.Key)
			obj, err := raw.GetObject(t.Context(), bucket, o.Key, minio.GetObjectOptions{})
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(obj)
			obj.Close()
			if err != nil {
				t.Fatal(err)
			}
			found = found || bytes.Contains(b, marker) || bytes.Contains(b, []byte("pages.img"))
		}
		return found, keys
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	enc, encBucket := newBucket(t, srv, key)
	in, err := enc.Put(t.Context(), img)
	if err != nil {
		t.Fatal(err)
	}
	found, keys := scan(encBucket)
	if found {
		t.Fatalf("an encrypted store holds the image's plaintext (objects %v)", keys)
	}
	if slices.ContainsFunc(keys, func(k string) bool { return bytes.Contains([]byte(k), []byte(in.Digest.String()[7:])) }) {
		t.Fatalf("an encrypted store's keys show the digest: %v", keys)
	}
	plain, plainBucket := newBucket(t, srv, nil)
	if _, err := plain.Put(t.Context(), img); err != nil {
		t.Fatal(err)
	}
	if found, _ := scan(plainBucket); !found {
		t.Fatal("the scan does not find the marker in a plain store: it proves nothing")
	}
	// The same bucket opened with another key: the image is unreadable.
	cfg := srv.Config(encBucket)
	cfg.Key = make([]byte, 32)
	other, err := snapstore.NewS3(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Stat(t.Context(), in.Digest); err == nil {
		t.Fatal("another key sees the image")
	}
	dst := filepath.Join(t.TempDir(), "img")
	if err := enc.Fetch(t.Context(), in.Digest, dst); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "pages.img")); !bytes.Equal(b, bytes.Repeat(marker, 100000)) {
		t.Fatal("fetched plaintext differs")
	}
}

func TestS3Unreachable(t *testing.T) {
	cfg := snapstore.S3Config{Endpoint: "http://127.0.0.1:1", Bucket: "x", AccessKey: "a", SecretKey: "b"}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	_, err := snapstore.NewS3(ctx, cfg)
	if !errdefs.Is(err, errdefs.Unavailable) {
		t.Fatalf("NewS3 of a closed port = %v, want Unavailable", err)
	}
	t.Log(err)
}

func TestParseURL(t *testing.T) {
	good := map[string]snapstore.S3Config{
		"s3://snaps?endpoint=http://127.0.0.1:8333":           {Endpoint: "http://127.0.0.1:8333", Bucket: "snaps"},
		"s3://snaps/clade/a?endpoint=https://h:1&region=eu-1": {Endpoint: "https://h:1", Bucket: "snaps", Prefix: "clade/a/", Region: "eu-1"},
	}
	for in, want := range good {
		got, err := snapstore.ParseURL(in)
		if err != nil || got.Endpoint != want.Endpoint || got.Bucket != want.Bucket || got.Prefix != want.Prefix || got.Region != want.Region {
			t.Errorf("ParseURL(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "s3://", "http://b?endpoint=http://h", "s3://b", "s3://b?endpoint=ftp://h", "s3://b?endpoint=http://h&x=1"} {
		if _, err := snapstore.ParseURL(bad); err == nil {
			t.Errorf("ParseURL(%q) = nil error", bad)
		}
	}
}

// BenchmarkS3PutFetch256MiB: put and fetch of a 256 MiB state dir (random
// bytes: no holes, nothing compressible), reported as MiB/s.
func BenchmarkS3PutFetch256MiB(b *testing.B) {
	srv := weedtest.Start(b)
	for _, enc := range []bool{false, true} {
		b.Run(fmt.Sprintf("encrypted=%v", enc), func(b *testing.B) {
			cfg := srv.Config("bench" + strconv.FormatBool(enc))
			if enc {
				cfg.Key = make([]byte, 32)
			}
			s, err := snapstore.NewS3(b.Context(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			for range b.N {
				src := t256(b)
				t0 := time.Now()
				in, err := s.Put(b.Context(), src)
				if err != nil {
					b.Fatal(err)
				}
				put := time.Since(t0)
				dst := filepath.Join(b.TempDir(), "img")
				t1 := time.Now()
				if err := s.Fetch(b.Context(), in.Digest, dst); err != nil {
					b.Fatal(err)
				}
				fetch := time.Since(t1)
				mib := float64(in.Size) / (1 << 20)
				b.ReportMetric(mib/put.Seconds(), "put-MiB/s")
				b.ReportMetric(mib/fetch.Seconds(), "fetch-MiB/s")
				if err := s.Delete(b.Context(), in.Digest); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func t256(b *testing.B) string {
	dir := b.TempDir()
	f, err := os.Create(filepath.Join(dir, "pages.img"))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.CopyN(f, rand.Reader, 256<<20); err != nil {
		b.Fatal(err)
	}
	f.Close()
	if err := stateimg.Seal(dir); err != nil {
		b.Fatal(err)
	}
	return dir
}
