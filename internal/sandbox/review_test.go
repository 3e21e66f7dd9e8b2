package sandbox

// Failing tests from the review of the hot pool, warm-pool learning, the
// held dial after a wake and the full-disk settle paths (branch
// review-hotpool). Each names the bug it shows.

import (
	"archive/tar"
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/store"
)

// countHandler counts log records whose message starts with msg.
type countHandler struct {
	msg string
	n   atomic.Int64
}

func (h *countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.msg) {
		h.n.Add(1)
	}
	return nil
}
func (h *countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countHandler) WithGroup(string) slog.Handler      { return h }

// TestSettleDoesNotMultiplyOnAFullDisk: settle retries a destroying record
// through destroyLocked, whose deleteRecord starts another settle when the
// disk is still full: every settle goroutine spawns one more per 2 s tick,
// so they double every 2 s for as long as the disk stays full.
func TestSettleDoesNotMultiplyOnAFullDisk(t *testing.T) {
	dbDir := smallDisk(t, t.TempDir(), "4m")
	e := newEnvDB(t, Config{}, filepath.Join(dbDir, "clade.db"))
	sb := e.create(t, 128)
	// A removal cut short after it recorded "destroying".
	if err := e.st.SetState(t.Context(), sb.ID, store.StateDestroying, ""); err != nil {
		t.Fatal(err)
	}
	filler := fillDisk(t, dbDir)
	defer os.Remove(filler)
	settles := &countHandler{msg: "reconcile: the database cannot record"}
	cfg := e.cfg
	cfg.Log = slog.New(settles)
	m := New(cfg, e.eng, e.st, e.imgs) // a restart on the full disk
	defer m.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if err := m.Reconcile(ctx); !errdefs.Is(err, errdefs.ResourceExhausted) {
		t.Skipf("the full disk did not refuse the delete (%v): nothing to settle", err)
	}
	time.Sleep(7 * time.Second) // three settle ticks
	if n := settles.n.Load(); n > 2 {
		t.Fatalf("%d settle goroutines started for one sandbox within 7 s on a full disk: each retry starts another (they double every 2 s)", n)
	}
}

// installDefaultWith installs an image under the default name whose root
// holds file: a new root, replacing the default image.
func (e *env) installDefaultWith(t *testing.T, file string) image.Image {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: os.Getuid(), Gid: os.Getgid()})
	_ = tw.WriteHeader(&tar.Header{Name: "etc/" + file, Typeflag: tar.TypeReg, Mode: 0o644, Size: 1, Uid: os.Getuid(), Gid: os.Getgid()})
	_, _ = tw.Write([]byte("x"))
	tw.Close()
	img, err := e.imgs.InstallTar(t.Context(), image.Image{Name: image.Default}, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if img, err = e.m.images.install(t.Context(), img); err != nil {
		t.Fatal(err)
	}
	return img
}

// TestHotPoolImageReplaced: the pool's shape names the image, not its
// root. After the default image is replaced (a pull, a build), a plain
// create claims a hot sandbox that runs the old root while its record
// names the new one; the root collection, which only counts records,
// has removed that old root from under it.
func TestHotPoolImageReplaced(t *testing.T) {
	e := newEnv(t, Config{HotPool: 1})
	e.installDefaultWith(t, "v1")
	e.m.Pools().Start(t.Context())
	waitHot(t, e.m, 1)
	newImg := e.installDefaultWith(t, "v2")
	sb, err := e.m.Create(t.Context(), CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if h, _ := e.m.Pools().HotStats(); h != 1 {
		t.Skip("the create did not claim the hot sandbox")
	}
	spec, _ := e.eng.Spec(sb.Engine())
	if spec.RootFS != sb.RootFS || sb.RootFS != newImg.RootFS {
		_, statErr := os.Stat(spec.RootFS)
		t.Fatalf("claimed sandbox runs on root %s (stat: %v) but its record names %s (the image's is %s)", spec.RootFS, statErr, sb.RootFS, newImg.RootFS)
	}
}

// TestHotSandboxSurvivesNameClash: a create whose name is taken fails at
// InsertSandbox after it took a hot sandbox, and destroys it: anyone can
// empty the hot pool (and make the daemon start sandboxes back to back)
// with creates of a taken name, or with creates it cancels at once.
func TestHotSandboxSurvivesNameClash(t *testing.T) {
	e := newEnv(t, Config{HotPool: 1})
	e.installDefault(t)
	e.m.Pools().Start(t.Context())
	waitHot(t, e.m, 1)
	first, err := e.m.Create(t.Context(), CreateRequest{Name: "taken"})
	if err != nil {
		t.Fatal(err)
	}
	waitHot(t, e.m, 1)
	ids, _ := e.eng.List(t.Context())
	var hot string
	for _, id := range ids {
		if id != first.ID {
			hot = id
		}
	}
	if _, err := e.m.Create(t.Context(), CreateRequest{Name: "taken"}); !errdefs.Is(err, errdefs.AlreadyExists) {
		t.Fatalf("create of a taken name: %v, want AlreadyExists", err)
	}
	if !e.eng.Started(t.Context(), hot) {
		t.Fatalf("a create refused for its name destroyed the hot sandbox %s instead of giving it back", hot)
	}
}

// TestDialHoldIsBounded: the hold after a wake re-wakes a sandbox put to
// sleep under it (each loop calls Guest), and every wake renews portGrace,
// so a dial to a port nothing listens on is held, and keeps waking the
// sandbox, for as long as something (a timeout with on_timeout sleep, an
// explicit sleep) keeps putting it to sleep. The ingress's dials are
// detached from the client's request (net/http since Go 1.23), so nobody
// even waits for it.
func TestDialHoldIsBounded(t *testing.T) {
	e := newEnv(t, Config{})
	sb := e.create(t, 128)
	if _, err := e.m.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Wake(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := e.m.Traffic().DialWaking(ctx, sb.ID, 8080) // the fake agent refuses every port
		done <- err
	}()
	before := e.m.Counters().Wakes.Load()
	for range 3 {
		time.Sleep(150 * time.Millisecond) // the dial holds, retrying every 25 ms
		if _, err := e.m.Sleep(t.Context(), sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(150 * time.Millisecond)
	woken := e.m.Counters().Wakes.Load() - before
	cancel()
	<-done
	if woken > 1 {
		t.Fatalf("one held dial woke the sandbox %d times after it was put to sleep under it; each wake renews the %s grace, so the hold has no bound", woken, portGrace)
	}
}

// TestHotPoolNotRefilledUnderPressure: the hot pool's refill is admitted
// against the memory floor only; with --pressure-floor above --memory-floor
// (+64 MiB) it refills below the pressure floor, WatchPressure gives the
// sandboxes back at its next tick, and since a tick whose flush gave
// something back ends there, idle sandboxes are never put to sleep.
func TestHotPoolNotRefilledUnderPressure(t *testing.T) {
	avail, err := memAvailableMiB()
	if err != nil {
		t.Skip("no /proc/meminfo")
	}
	e := newEnv(t, Config{HotPool: 1, PressureFloorMiB: avail + 1024}) // under pressure now
	e.installDefault(t)
	e.m.Pools().Start(t.Context())
	time.Sleep(300 * time.Millisecond) // a refill takes ~1 ms on the fake engine
	if n := e.m.Pools().Hot(); n != 0 {
		t.Fatalf("below the pressure floor the hot pool refilled (%d): WatchPressure gives it back at once, every tick", n)
	}
}

// labelEnvHook fills in the spec from options that are not part of a
// pool's shape, as the volumes and secrets hooks (branch volumes) do with
// mounts and secret environment variables.
type labelEnvHook struct{ recordingHook }

func (h *labelEnvHook) Name() string { return "label-env" }
func (h *labelEnvHook) BeforeStart(_ context.Context, rec store.Sandbox, spec *engine.Spec) error {
	if v := rec.Opts.Labels["secret"]; v != "" {
		spec.Env = append(spec.Env, "SECRET="+v)
	}
	return nil
}

// TestHotClaimKeepsTheHooksSpec: claimHot runs the hooks' BeforeStart and
// drops the spec they fill in. A hook that adds to the spec from options
// outside the shape (volumes' mounts, secrets' environment) is silently
// lost for a create that claims a hot sandbox.
func TestHotClaimKeepsTheHooksSpec(t *testing.T) {
	e := newEnv(t, Config{HotPool: 1, Hooks: []Hook{&labelEnvHook{}}})
	e.installDefault(t)
	e.m.Pools().Start(t.Context())
	waitHot(t, e.m, 1)
	sb, err := e.m.Create(t.Context(), CreateRequest{Opts: store.Options{Labels: map[string]string{"secret": "s3"}}})
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := e.eng.Spec(sb.Engine())
	if !slices.Contains(spec.Env, "SECRET=s3") {
		t.Fatalf("the sandbox runs with env %q: its hook's SECRET=s3 was dropped by the hot claim", spec.Env)
	}
}
