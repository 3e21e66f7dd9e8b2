package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/store"
)

// installDefault installs an empty image under the default image's name,
// which the pools keep sandboxes of.
func (e *env) installDefault(t *testing.T) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: os.Getuid(), Gid: os.Getgid()})
	tw.Close()
	img, err := e.imgs.InstallTar(t.Context(), image.Image{Name: image.Default}, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.images.install(t.Context(), img); err != nil {
		t.Fatal(err)
	}
}

// waitHot waits (bounded) until the hot pool holds n started sandboxes.
func waitHot(t *testing.T, m *Manager, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for m.Pools().Hot() != n {
		if time.Now().After(deadline) {
			t.Fatalf("hot pool holds %d, want %d", m.Pools().Hot(), n)
		}
		time.Sleep(time.Millisecond) // polling the pool's background refill
	}
}

// waitHotShape waits (bounded) until the hot pool holds n started
// sandboxes of mib MiB.
func waitHotShape(t *testing.T, m *Manager, mib, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		m.pools.mu.Lock()
		got := 0
		for _, h := range m.pools.hot {
			if h.spec.MemoryMiB == mib {
				got++
			}
		}
		m.pools.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("hot pool holds %d of %d MiB, want %d", got, mib, n)
		}
		time.Sleep(time.Millisecond) // polling the pool's background refill
	}
}

func TestHotPoolClaim(t *testing.T) {
	e := newEnv(t, Config{HotPool: 1})
	e.installDefault(t)
	e.m.Pools().Start(t.Context())
	waitHot(t, e.m, 1)
	started, _ := e.eng.List(t.Context())
	if len(started) != 1 {
		t.Fatalf("engine sandboxes: %v, want the one hot sandbox", started)
	}
	sb, err := e.m.Create(t.Context(), CreateRequest{Name: "claimed"})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != started[0] || e.state(t, sb.ID) != "running" {
		t.Fatalf("created %s (%s), want the hot sandbox %s running", sb.ID, e.state(t, sb.ID), started[0])
	}
	if h, m := e.m.Pools().HotStats(); h != 1 || m != 0 {
		t.Fatalf("hot pool stats: %d hits %d misses", h, m)
	}
	g, err := e.m.GuestWaking(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Ping(t.Context()); err != nil {
		t.Fatalf("the claimed sandbox's guest: %v", err)
	}
	if ids, _ := e.st.PoolSandboxes(t.Context()); len(ids) > 1 || len(ids) == 1 && ids[0] == sb.ID {
		t.Fatalf("pool marks after a claim: %v; the claimed one must be unmarked", ids)
	}
	waitHot(t, e.m, 1) // refilled
	// Another shape is not served hot.
	other, err := e.m.Create(t.Context(), CreateRequest{Image: testImage, MemoryMiB: 128})
	if err != nil {
		t.Fatal(err)
	}
	if _, m := e.m.Pools().HotStats(); m != 1 || other.ID == sb.ID {
		t.Fatalf("a create of another shape: hot misses %d", m)
	}
}

// TestHotPoolRestartDestroysUnclaimed: a daemon killed with hot sandboxes
// leaves started engine sandboxes without records; the next one destroys
// them (and keeps the claimed one), though it keeps other unrecorded
// started sandboxes (a lost database).
func TestHotPoolRestartDestroysUnclaimed(t *testing.T) {
	e := newEnv(t, Config{HotPool: 2})
	e.installDefault(t)
	e.m.Pools().Start(t.Context())
	waitHot(t, e.m, 2)
	sb, err := e.m.Create(t.Context(), CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	waitHot(t, e.m, 2)
	// The crash: no Close, a new service on the same store and engine.
	e.restart(t, Config{})
	ids, _ := e.eng.List(t.Context())
	if len(ids) != 1 || ids[0] != sb.ID {
		t.Fatalf("engine sandboxes after the restart: %v, want only the claimed %s", ids, sb.ID)
	}
	if marks, _ := e.st.PoolSandboxes(t.Context()); len(marks) != 0 {
		t.Fatalf("pool marks after the restart: %v", marks)
	}
	if e.state(t, sb.ID) != "running" {
		t.Fatalf("the claimed sandbox is %s after the restart", e.state(t, sb.ID))
	}
}

func TestHotPoolFlushedUnderPressure(t *testing.T) {
	e := newEnv(t, Config{HotPool: 2})
	e.installDefault(t)
	e.m.Pools().Start(t.Context())
	waitHot(t, e.m, 2)
	if n := e.m.pools.flushHot(t.Context()); n != 2 {
		t.Fatalf("flushed %d, want 2", n)
	}
	if ids, _ := e.eng.List(t.Context()); len(ids) > 2 {
		t.Fatalf("engine sandboxes after a flush: %v", ids)
	}
	waitHot(t, e.m, 2) // memory is fine here: it refills
}

// TestHotPoolConcurrentClaims: creates racing for a small hot pool each
// get a sandbox of their own (a hot one or a cold one), all running and
// recorded, none claimed twice, and no pool mark left on a recorded one.
func TestHotPoolConcurrentClaims(t *testing.T) {
	e := newEnv(t, Config{HotPool: 3})
	e.installDefault(t)
	e.m.Pools().Start(t.Context())
	waitHot(t, e.m, 3)
	const n = 12
	ids := make(chan string, n)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			sb, err := e.m.Create(t.Context(), CreateRequest{Name: fmt.Sprintf("c%d", i)})
			ids <- sb.ID
			errs <- err
		}()
	}
	seen := map[string]bool{}
	for range n {
		id, err := <-ids, <-errs
		if err != nil {
			t.Fatal(err)
		}
		if seen[id] {
			t.Fatalf("sandbox %s handed to two creates", id)
		}
		seen[id] = true
		if st := e.state(t, id); st != "running" {
			t.Fatalf("%s is %s", id, st)
		}
	}
	if h, _ := e.m.Pools().HotStats(); h < 3 {
		t.Fatalf("hot hits %d, want the 3 hot sandboxes claimed", h)
	}
	marks, _ := e.st.PoolSandboxes(t.Context())
	for _, id := range marks {
		if seen[id] {
			t.Fatalf("claimed sandbox %s is still marked as the pool's", id)
		}
	}
	// Every engine sandbox is a recorded one or a hot one.
	live, _ := e.eng.List(t.Context())
	for _, id := range live {
		if !seen[id] && !slices.Contains(marks, id) {
			t.Fatalf("engine sandbox %s is neither recorded nor marked", id)
		}
	}
}

// TestHotPoolTakenName: a create whose name is taken is refused before it
// touches the hot pool, which a claim renames before it records: a client
// repeating such creates must not make the daemon burn hot sandboxes.
func TestHotPoolTakenName(t *testing.T) {
	e := newEnv(t, Config{HotPool: 1})
	e.installDefault(t)
	e.m.Pools().Start(t.Context())
	waitHot(t, e.m, 1)
	if _, err := e.m.Create(t.Context(), CreateRequest{Name: "dup"}); err != nil {
		t.Fatal(err)
	}
	waitHot(t, e.m, 1)
	before, _ := e.eng.List(t.Context())
	hits, _ := e.m.Pools().HotStats()
	for range 3 {
		if _, err := e.m.Create(t.Context(), CreateRequest{Name: "dup"}); !errdefs.Is(err, errdefs.AlreadyExists) {
			t.Fatalf("create of a taken name: %v, want AlreadyExists", err)
		}
	}
	after, _ := e.eng.List(t.Context())
	if h, _ := e.m.Pools().HotStats(); h != hits || e.m.Pools().Hot() != 1 || !slices.Equal(before, after) {
		t.Fatalf("creates of a taken name touched the hot pool: hits %d -> %d, hot %d, engine %v -> %v", hits, h, e.m.Pools().Hot(), before, after)
	}
}

// TestHotPoolLearnsShapes: a shape plain creates missed twice gets a hot
// sandbox of its own, which the next create of it claims; learned shapes
// together hold at most HotPool, the least recently asked for giving way;
// a create with a secret file (a mount a hot sandbox lacks) is never
// served hot and teaches the pool nothing.
func TestHotPoolLearnsShapes(t *testing.T) {
	e := newEnv(t, Config{HotPool: 1})
	e.installDefault(t)
	e.m.Pools().Start(t.Context())
	waitHot(t, e.m, 1)
	for range 2 {
		if _, err := e.m.Create(t.Context(), CreateRequest{Image: testImage, MemoryMiB: 128}); err != nil {
			t.Fatal(err)
		}
	}
	if h, m := e.m.Pools().HotStats(); h != 0 || m != 2 {
		t.Fatalf("hot pool stats after two creates of a new shape: %d hits %d misses", h, m)
	}
	waitHotShape(t, e.m, 128, 1)
	waitHot(t, e.m, 2) // the default shape's and the learned one's
	before, _ := e.eng.List(t.Context())
	sb, err := e.m.Create(t.Context(), CreateRequest{Image: testImage, MemoryMiB: 128})
	if err != nil {
		t.Fatal(err)
	}
	if h, _ := e.m.Pools().HotStats(); h != 1 || !slices.Contains(before, sb.ID) || e.state(t, sb.ID) != "running" {
		t.Fatalf("third create of the learned shape: hot hits %d, sandbox %s (%s) among %v", h, sb.ID, e.state(t, sb.ID), before)
	}
	waitHot(t, e.m, 2) // refilled

	// A create with a secret file: not served hot, no miss counted.
	_, misses := e.m.Pools().HotStats()
	hot := e.m.Pools().Hot()
	for range 2 {
		sb, err := e.m.Create(t.Context(), CreateRequest{Image: testImage, MemoryMiB: 128, Opts: store.Options{Secrets: []store.SecretRef{{Name: "k", File: "/run/secrets/k"}}}})
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(before, sb.ID) {
			t.Fatalf("a create with a secret file took hot sandbox %s", sb.ID)
		}
	}
	if h, m := e.m.Pools().HotStats(); h != 1 || m != misses || e.m.Pools().Hot() != hot {
		t.Fatalf("creates with a secret file touched the hot pool: %d hits, misses %d -> %d, hot %d -> %d", h, misses, m, hot, e.m.Pools().Hot())
	}

	// A second learned shape takes the first one's place: 1 + 1 at most.
	for range 2 {
		if _, err := e.m.Create(t.Context(), CreateRequest{Image: testImage, MemoryMiB: 192}); err != nil {
			t.Fatal(err)
		}
	}
	waitHotShape(t, e.m, 192, 1)
	waitHotShape(t, e.m, 128, 0) // given way
	waitHot(t, e.m, 2)
	sb, err = e.m.Create(t.Context(), CreateRequest{Image: testImage, MemoryMiB: 192})
	if err != nil {
		t.Fatal(err)
	}
	if h, _ := e.m.Pools().HotStats(); h != 2 {
		t.Fatalf("third create of the second learned shape: hot hits %d, want 2", h)
	}
	waitHot(t, e.m, 2)
	if _, err := e.m.Create(t.Context(), CreateRequest{Image: testImage, MemoryMiB: 128}); err != nil {
		t.Fatal(err)
	}
	if h, _ := e.m.Pools().HotStats(); h != 2 {
		t.Fatalf("the first learned shape, given way: hot hits %d, want still 2", h)
	}
}

// failStartHook fails AfterStart for sandboxes labelled fail.
type failStartHook struct{ recordingHook }

func (h *failStartHook) AfterStart(_ context.Context, rec store.Sandbox, _ engine.Sandbox) error {
	if rec.Opts.Labels["fail"] != "" {
		return errors.New("refused by the test hook")
	}
	return nil
}

// TestHotClaimFailingHookLeavesNothing: a claim applies its hooks before
// its one store write, so a hook that fails leaves no record, no pool
// mark and no engine sandbox (the hot one is spent: its hooks ran).
func TestHotClaimFailingHookLeavesNothing(t *testing.T) {
	e := newEnv(t, Config{HotPool: 1, Hooks: []Hook{&failStartHook{}}})
	e.installDefault(t)
	e.m.Pools().Start(t.Context())
	waitHot(t, e.m, 1)
	started, _ := e.eng.List(t.Context())
	if len(started) != 1 {
		t.Fatalf("engine sandboxes: %v, want the one hot sandbox", started)
	}
	hot := started[0]
	_, err := e.m.Create(t.Context(), CreateRequest{Name: "doomed", Opts: store.Options{Labels: map[string]string{"fail": "1"}}})
	if err == nil || !strings.Contains(err.Error(), "refused by the test hook") {
		t.Fatalf("create: %v, want the hook's error", err)
	}
	if _, err := e.st.GetSandbox(t.Context(), "doomed"); !errdefs.IsNotFound(err) {
		t.Fatalf("record after a failed claim: %v, want none", err)
	}
	if ids, _ := e.st.PoolSandboxes(t.Context()); slices.Contains(ids, hot) {
		t.Fatalf("pool marks %v still hold the spent hot sandbox %s", ids, hot)
	}
	if ids, _ := e.eng.List(t.Context()); slices.Contains(ids, hot) {
		t.Fatalf("engine sandboxes %v still hold the spent hot sandbox %s", ids, hot)
	}
	// The name is free and the pool refills: the next claim works.
	waitHot(t, e.m, 1)
	sb, err := e.m.Create(t.Context(), CreateRequest{Name: "doomed"})
	if err != nil || e.state(t, sb.ID) != "running" {
		t.Fatalf("the next claim: %+v %v, want it running", sb, err)
	}
}

// hotOn counts the hot sandboxes started on root.
func hotOn(m *Manager, root string) int {
	m.pools.mu.Lock()
	defer m.pools.mu.Unlock()
	n := 0
	for _, h := range m.pools.hot {
		if h.root == root {
			n++
		}
	}
	return n
}

// TestHotPoolPerImage: HotImages keeps started sandboxes of other images
// than the default, as many of each as asked, beside the default image's;
// a plain create of such an image claims one (a hit, no miss) and the pool
// refills it; an image the pool is asked for but that does not exist
// holds up none of the others.
func TestHotPoolPerImage(t *testing.T) {
	e := newEnv(t, Config{HotPool: 1, HotImages: map[string]int{testImage: 2, "not-there": 1}})
	e.installDefault(t)
	def, err := e.m.images.Get(t.Context(), image.Default)
	if err != nil {
		t.Fatal(err)
	}
	other, err := e.m.images.Get(t.Context(), testImage)
	if err != nil {
		t.Fatal(err)
	}
	e.m.Pools().Start(t.Context())
	waitHot(t, e.m, 3)
	if d, o := hotOn(e.m, def.RootFS), hotOn(e.m, other.RootFS); d != 1 || o != 2 {
		t.Fatalf("hot sandboxes: %d of the default image, %d of %s; want 1 and 2", d, o, testImage)
	}
	before := map[string]bool{}
	e.m.pools.mu.Lock()
	for id, h := range e.m.pools.hot {
		if h.root == other.RootFS {
			before[id] = true
		}
	}
	e.m.pools.mu.Unlock()
	sb, err := e.m.Create(t.Context(), CreateRequest{Image: testImage})
	if err != nil {
		t.Fatal(err)
	}
	if !before[sb.ID] || sb.Image != testImage || e.state(t, sb.ID) != "running" {
		t.Fatalf("created %s of %s (%s), want one of the hot sandboxes of %s %v", sb.ID, sb.Image, e.state(t, sb.ID), testImage, before)
	}
	if h, m := e.m.Pools().HotStats(); h != 1 || m != 0 {
		t.Fatalf("hot pool stats after a create of %s: %d hits %d misses, want 1 and 0", testImage, h, m)
	}
	waitHot(t, e.m, 3) // refilled, with the image's shape
	if o := hotOn(e.m, other.RootFS); o != 2 {
		t.Fatalf("after the refill %d hot sandboxes of %s, want 2", o, testImage)
	}
	// The default image's is still served hot.
	if _, err := e.m.Create(t.Context(), CreateRequest{}); err != nil {
		t.Fatal(err)
	}
	if h, m := e.m.Pools().HotStats(); h != 2 || m != 0 {
		t.Fatalf("hot pool stats after a default create: %d hits %d misses, want 2 and 0", h, m)
	}
}

// TestHotPoolImagesOnly: a pool with no default image's sandboxes (HotPool
// 0) still keeps those of HotImages.
func TestHotPoolImagesOnly(t *testing.T) {
	e := newEnv(t, Config{HotImages: map[string]int{testImage: 1}})
	e.installDefault(t)
	e.m.Pools().Start(t.Context())
	waitHot(t, e.m, 1)
	other, _ := e.m.images.Get(t.Context(), testImage)
	if o := hotOn(e.m, other.RootFS); o != 1 {
		t.Fatalf("%d hot sandboxes of %s, want 1", o, testImage)
	}
	if _, err := e.m.Create(t.Context(), CreateRequest{}); err != nil {
		t.Fatal(err)
	}
	if h, _ := e.m.Pools().HotStats(); h != 0 {
		t.Fatalf("a default create claimed a hot sandbox (%d hits) with HotPool 0", h)
	}
}
