package snapstore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/snapstore"
	"github.com/clade-sandbox/clade/internal/snapstore/storetest"
	"github.com/clade-sandbox/clade/internal/snapstore/weedtest"
	"github.com/minio/minio-go/v7"
)

// TestCopiesRoots: a copy's image root goes to the store before the
// copy's record, once per root (two copies at once on one node, and a
// second node's copy, upload it once), streamed (a root of several parts),
// sealed under a key when there is one (no byte or identity in the clear);
// it reads back whole, and goes only when the last image naming it goes.
// In S3, and in a directory store the same way.
func TestCopiesRoots(t *testing.T) {
	t.Parallel() // a weed of its own: its start (~13 s) overlaps another test's
	srv := weedtest.Start(t)
	raw := rawClient(t, srv)
	for _, kind := range []string{"s3", "s3-encrypted", "dir"} {
		t.Run(kind, func(t *testing.T) {
			enc := kind == "s3-encrypted"
			s, objects := rootStore(t, srv, raw, kind)
			marker := []byte("clade-root-marker-" + fmt.Sprint(enc))
			// 40 MiB: three parts of the upload, most of it random.
			root := make([]byte, 40<<20)
			_, _ = rand.Read(root)
			for i := 0; i < len(root); i += 1 << 20 {
				copy(root[i:], marker)
			}
			sum := sha256.Sum256([]byte("a root identity"))
			id := "sha256:" + hex.EncodeToString(sum[:])
			var sends atomic.Int32
			src := func(ctx context.Context, name, dir string) (string, func(context.Context, io.Writer) error, error) {
				if strings.HasSuffix(name, "/mine") {
					return "", nil, nil // a root this node's only
				}
				return id, func(ctx context.Context, w io.Writer) error {
					sends.Add(1)
					_, err := io.Copy(w, bytes.NewReader(root))
					return err
				}, nil
			}
			// A send that fails midway (past a part) makes no object.
			failID := "sha256:" + hex.EncodeToString(make([]byte, 32))
			err := s.PutRoot(t.Context(), failID, func(w io.Writer) error {
				if _, err := w.Write(root[:20<<20]); err != nil {
					return err
				}
				return fmt.Errorf("the root went")
			})
			if err == nil || !strings.Contains(err.Error(), "the root went") {
				t.Fatalf("PutRoot of a failed send: %v", err)
			}
			if has, err := s.HasRoot(t.Context(), failID); has || err != nil {
				t.Fatalf("a failed send left a root: %v %v", has, err)
			}
			base := t.TempDir()
			node := func(name string) *snapstore.Copies {
				c, err := snapstore.NewCopies(s, filepath.Join(base, name), nil)
				if err != nil {
					t.Fatal(err)
				}
				c.SetRoots(src)
				return c
			}
			c1, c2 := node("n1"), node("n2")
			imgs := map[string]string{}
			for _, n := range []string{"a", "b", "c", "mine"} {
				imgs[n] = storetest.MakeImage(t, filepath.Join(base, "img", n), 64<<10+len(n))
			}
			var wg sync.WaitGroup
			for _, n := range []string{"a", "b"} {
				c1.Put("sleep/"+n, imgs[n])
			}
			for _, n := range []string{"a", "b"} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := c1.Wait(t.Context(), "sleep/"+n); err != nil {
						t.Error(err)
					}
				}()
			}
			wg.Wait()
			for _, n := range []string{"a", "b"} {
				if _, err := c1.Digest("sleep/" + n); err != nil {
					t.Fatalf("no record of sleep/%s: %v", n, err)
				}
			}
			if has, err := s.HasRoot(t.Context(), id); !has || err != nil {
				t.Fatalf("after two copies the store has the root: %v %v", has, err)
			}
			c2.Put("sleep/c", imgs["c"])
			c2.Put("sleep/mine", imgs["mine"])
			if err := errorsJoin(c2.Wait(t.Context(), "sleep/c"), c2.Wait(t.Context(), "sleep/mine")); err != nil {
				t.Fatal(err)
			}
			if got := sends.Load(); got != 1 {
				t.Fatalf("the root was sent %d times for three copies on it, want 1", got)
			}
			rc, err := c2.OpenRoot(t.Context(), id)
			if err != nil {
				t.Fatal(err)
			}
			back, err := io.ReadAll(rc)
			rc.Close()
			if err != nil || !bytes.Equal(back, root) {
				t.Fatalf("the root read back: %d bytes (want %d), equal %v, %v", len(back), len(root), bytes.Equal(back, root), err)
			}
			other := sha256.Sum256([]byte("no such root"))
			if _, err := c2.OpenRoot(t.Context(), "sha256:"+hex.EncodeToString(other[:])); !errdefs.IsNotFound(err) {
				t.Fatalf("OpenRoot of a root not stored: %v, want NotFound", err)
			}
			if _, err := c2.OpenRoot(t.Context(), "sha256:../x"); !errdefs.Is(err, errdefs.InvalidArgument) {
				t.Fatalf("OpenRoot of a bad id: %v, want InvalidArgument", err)
			}
			keys := objects(func(key string, b []byte) {
				if enc && (bytes.Contains(b, marker) || bytes.Contains(b, []byte(id))) {
					t.Fatalf("object %s holds the root's bytes or its identity in the clear", key)
				}
			})
			hexID := strings.TrimPrefix(id, "sha256:")
			if named := strings.Contains(strings.Join(keys, " "), hexID); named == enc {
				t.Fatalf("encrypted %v: a key names the root's identity: %v (%v)", enc, named, keys)
			}
			t.Logf("objects: %d", len(keys))

			// Dropped: the root stays while an image names it, on either node.
			for _, n := range []string{"a", "b"} {
				if err := c1.Drop("sleep/" + n); err != nil {
					t.Fatal(err)
				}
			}
			// The image's delete follows its root's unref, in the background.
			gone := func(n string) {
				t.Helper()
				d, _, err := snapstore.DigestOf(imgs[n])
				if err != nil {
					t.Fatal(err)
				}
				deadline := time.Now().Add(time.Minute)
				for {
					has, err := snapstore.Has(t.Context(), s, d)
					if err == nil && !has {
						return
					}
					if time.Now().After(deadline) {
						t.Fatalf("image %s still stored a minute after its drop: %v", n, err)
					}
					select {
					case <-t.Context().Done():
						t.Fatal(t.Context().Err())
					case <-time.After(50 * time.Millisecond): // polling the store
					}
				}
			}
			gone("a")
			gone("b")
			if has, err := s.HasRoot(t.Context(), id); !has || err != nil {
				t.Fatalf("with sleep/c still stored the root is gone: %v %v", has, err)
			}
			if err := c2.Drop("sleep/mine"); err != nil {
				t.Fatal(err)
			}
			if err := c2.Drop("sleep/c"); err != nil {
				t.Fatal(err)
			}
			gone("mine")
			gone("c")
			// No image names it now: it stays for the grace.
			c2.SweepRootsAt(t.Context(), time.Now())
			if has, err := s.HasRoot(t.Context(), id); !has || err != nil {
				t.Fatalf("within its grace the root is gone: %v %v", has, err)
			}
			// Named again within the grace (a sandbox slept again): nothing
			// uploaded, and a sweep past the grace keeps it.
			imgs["e"] = storetest.MakeImage(t, filepath.Join(base, "img", "e"), 70<<10)
			c1.Put("sleep/e", imgs["e"])
			if err := c1.Wait(t.Context(), "sleep/e"); err != nil {
				t.Fatal(err)
			}
			if got := sends.Load(); got != 1 {
				t.Fatalf("the root was sent %d times, want 1 (it was still stored)", got)
			}
			c2.SweepRootsAt(t.Context(), time.Now().Add(2*snapstore.DefaultRootGrace))
			if has, err := s.HasRoot(t.Context(), id); !has || err != nil {
				t.Fatalf("a sweep deleted a root an image names: %v %v", has, err)
			}
			if err := c1.Drop("sleep/e"); err != nil {
				t.Fatal(err)
			}
			gone("e")
			c1.SweepRootsAt(t.Context(), time.Now().Add(2*snapstore.DefaultRootGrace))
			if has, err := s.HasRoot(t.Context(), id); has || err != nil {
				t.Fatalf("past its grace, with no image naming it, the root stays: %v %v", has, err)
			}
			c1.Close()
			c2.Close()
			if left := objects(nil); len(left) != 0 {
				t.Fatalf("objects left after every copy was dropped: %v", left)
			}
		})
	}
}

func errorsJoin(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

type storeWithRoots interface {
	snapstore.Store
	snapstore.RootStore
}

// rootStore makes an empty store of kind (s3, s3-encrypted, dir) and a
// lister of its objects (the bucket's keys, the directory's files), which
// calls see with each one's bytes when it is not nil.
func rootStore(t *testing.T, srv *weedtest.Server, raw *minio.Client, kind string) (storeWithRoots, func(see func(key string, b []byte)) []string) {
	t.Helper()
	if kind == "dir" {
		root := filepath.Join(t.TempDir(), "store")
		s, err := snapstore.NewLocal(root)
		if err != nil {
			t.Fatal(err)
		}
		return s, func(see func(string, []byte)) []string {
			var keys []string
			err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
				if err != nil || e.IsDir() {
					return err
				}
				rel, _ := filepath.Rel(root, p)
				keys = append(keys, rel)
				if see != nil {
					b, err := os.ReadFile(p)
					if err != nil {
						return err
					}
					see(rel, b)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			return keys
		}
	}
	var key []byte
	if kind == "s3-encrypted" {
		key = make([]byte, 32)
		_, _ = rand.Read(key)
	}
	s, bucket := newBucket(t, srv, key)
	return s, func(see func(string, []byte)) []string {
		var keys []string
		for o := range raw.ListObjects(t.Context(), bucket, minio.ListObjectsOptions{Recursive: true}) {
			if o.Err != nil {
				t.Fatal(o.Err)
			}
			keys = append(keys, o.Key)
			if see == nil {
				continue
			}
			obj, err := raw.GetObject(t.Context(), bucket, o.Key, minio.GetObjectOptions{})
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(obj)
			obj.Close()
			if err != nil {
				t.Fatal(err)
			}
			see(o.Key, b)
		}
		return keys
	}
}

// TestRootSweepRace: the sweep's delete of a root no image names races a
// copy on another node that names it again. The copy writes its ref
// (test hook) right after the sweep listed the refs and found none, and
// finds the root still there (so uploads nothing): the root must stay.
// The copy writes its ref once the root is set aside: it uploads the root
// anew, and the root stays. Nothing is left aside; with no image naming
// it, the root goes. In S3 and in a directory store.
func TestRootSweepRace(t *testing.T) {
	t.Parallel() // a weed of its own: its start (~13 s) overlaps another test's
	srv := weedtest.Start(t)
	raw := rawClient(t, srv)
	for _, kind := range []string{"s3", "dir"} {
		t.Run(kind, func(t *testing.T) {
			s, objects := rootStore(t, srv, raw, kind)
			sum := sha256.Sum256([]byte("a raced root"))
			id := "sha256:" + hex.EncodeToString(sum[:])
			root := bytes.Repeat([]byte("raced root "), 10000)
			var sends atomic.Int32
			src := func(ctx context.Context, name, dir string) (string, func(context.Context, io.Writer) error, error) {
				return id, func(ctx context.Context, w io.Writer) error {
					sends.Add(1)
					_, err := w.Write(root)
					return err
				}, nil
			}
			base := t.TempDir()
			node := func(name string) *snapstore.Copies {
				c, err := snapstore.NewCopies(s, filepath.Join(base, name), nil)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(c.Close)
				c.SetRoots(src)
				return c
			}
			sweeper, writer := node("n1"), node("n2")
			put := func(c *snapstore.Copies, n string) {
				t.Helper()
				c.Put("sleep/"+n, storetest.MakeImage(t, filepath.Join(base, "img", n), 64<<10+len(n)))
				if err := c.Wait(t.Context(), "sleep/"+n); err != nil {
					t.Fatal(err)
				}
			}
			drop := func(c *snapstore.Copies, n string) {
				t.Helper()
				d, err := c.Digest("sleep/" + n)
				if err != nil {
					t.Fatal(err)
				}
				if err := c.Drop("sleep/" + n); err != nil {
					t.Fatal(err)
				}
				waitStore(t, func() bool {
					has, err := snapstore.Has(t.Context(), s, d)
					return err == nil && !has
				})
			}
			hasRoot := func() bool {
				has, err := s.HasRoot(t.Context(), id)
				if err != nil {
					t.Fatal(err)
				}
				return has
			}
			past := time.Now().Add(2 * snapstore.DefaultRootGrace)
			for i, step := range []string{"root-sweep-refs-listed", "root-sweep-set-aside"} {
				n := fmt.Sprint("a", i)
				put(sweeper, n)
				drop(sweeper, n) // noted unneeded by the sweeper
				before := sends.Load()
				hit := false
				sweeper.SetTestHook(func(at string) {
					if at == step {
						hit = true
						put(writer, fmt.Sprint("b", i))
					}
				})
				sweeper.SweepRootsAt(t.Context(), past)
				sweeper.SetTestHook(nil)
				if !hit {
					t.Fatalf("the sweep never reached %s", step)
				}
				if !hasRoot() {
					t.Fatalf("a copy named the root at %s (%d uploads), and the sweep deleted it", step, sends.Load()-before)
				}
				t.Logf("named again at %s: the root stays (%d uploads by the copy)", step, sends.Load()-before)
				for _, k := range objects(nil) {
					if strings.Contains(k, "aside-") {
						t.Fatalf("%s left behind", k)
					}
				}
				rc, err := writer.OpenRoot(t.Context(), id)
				if err != nil {
					t.Fatal(err)
				}
				back, err := io.ReadAll(rc)
				rc.Close()
				if err != nil || !bytes.Equal(back, root) {
					t.Fatalf("the root read back: %d bytes, %v", len(back), err)
				}
				drop(writer, fmt.Sprint("b", i))
				writer.SweepRootsAt(t.Context(), past)
				if hasRoot() {
					t.Fatal("with no image naming it, past its grace, the root stays")
				}
			}
			if left := objects(nil); len(left) != 0 {
				t.Fatalf("objects left: %v", left)
			}
		})
	}
}

// waitStore polls the store until ok (the drops' deletes run in the
// background), for a minute at most.
func waitStore(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("the store did not get there within a minute")
		}
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-time.After(50 * time.Millisecond): // polling the store
		}
	}
}

// mapSums is a snapstore.RootSums in memory, its lock one mutex.
type mapSums struct {
	mu   sync.Mutex
	m    map[string][]byte
	lock sync.Mutex
}

func (s *mapSums) RootSum(ctx context.Context, id string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[id], nil
}

func (s *mapSums) LockRoot(ctx context.Context, id string, waiting func()) (snapstore.RootLock, error) {
	s.lock.Lock()
	return mapLock{s, id}, nil
}

type mapLock struct {
	s  *mapSums
	id string
}

func (l mapLock) RecordSum(ctx context.Context, sum []byte) error {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	l.s.m[l.id] = sum
	return nil
}

func (l mapLock) DropSum(ctx context.Context) error {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	delete(l.s.m, l.id)
	return nil
}

func (l mapLock) Unlock() { l.s.lock.Unlock() }

// TestCopiesRootSums: a root's upload records the SHA-256 of the stream
// it sent (what a wake checks the store's copy against), and a root found
// stored with no sum recorded (an older node's upload) is uploaded again.
func TestCopiesRootSums(t *testing.T) {
	s, err := snapstore.NewLocal(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("a summed root"))
	id := "sha256:" + hex.EncodeToString(sum[:])
	root := bytes.Repeat([]byte("summed root "), 5000)
	var sends atomic.Int32
	src := func(ctx context.Context, name, dir string) (string, func(context.Context, io.Writer) error, error) {
		return id, func(ctx context.Context, w io.Writer) error {
			sends.Add(1)
			_, err := w.Write(root)
			return err
		}, nil
	}
	base := t.TempDir()
	c, err := snapstore.NewCopies(s, filepath.Join(base, "n1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetRoots(src)
	sums := &mapSums{m: map[string][]byte{}}
	c.SetRootSums(sums)
	put := func(n string) {
		t.Helper()
		c.Put("sleep/"+n, storetest.MakeImage(t, filepath.Join(base, "img", n), 64<<10+len(n)))
		if err := c.Wait(t.Context(), "sleep/"+n); err != nil {
			t.Fatal(err)
		}
	}
	put("a")
	want := sha256.Sum256(root)
	if got, _ := sums.RootSum(t.Context(), id); !bytes.Equal(got, want[:]) || sends.Load() != 1 {
		t.Fatalf("after the upload the sum recorded is %x (want %x), %d sends", got, want, sends.Load())
	}
	put("b")
	if sends.Load() != 1 {
		t.Fatalf("a root stored with its sum was uploaded again (%d sends)", sends.Load())
	}
	sums.mu.Lock()
	delete(sums.m, id)
	sums.mu.Unlock()
	put("c")
	if got, _ := sums.RootSum(t.Context(), id); !bytes.Equal(got, want[:]) || sends.Load() != 2 {
		t.Fatalf("a root stored with no sum recorded: sum %x, %d sends (want it uploaded again)", got, sends.Load())
	}
}
