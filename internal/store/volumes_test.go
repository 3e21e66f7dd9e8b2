package store

import (
	"fmt"
	"testing"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

func TestVolumeRecords(t *testing.T) {
	ctx := t.Context()
	st := openTest(t)
	v := Volume{ID: "v1", Name: "data", SizeBytes: 1 << 30, State: VolumeCreating}
	if err := st.InsertVolume(ctx, v); err != nil {
		t.Fatal(err)
	}
	if err := st.InsertVolume(ctx, Volume{ID: "v2", Name: "data", SizeBytes: 1, State: VolumeCreating}); !errdefs.Is(err, errdefs.AlreadyExists) {
		t.Fatalf("a taken name: %v", err)
	}
	if err := st.SetVolumeState(ctx, "v1", VolumeReady); err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"v1", "data"} {
		got, err := st.GetVolume(ctx, ref)
		if err != nil || got.ID != "v1" || got.State != VolumeReady || got.SizeBytes != 1<<30 {
			t.Fatalf("get %s: %+v %v", ref, got, err)
		}
	}
	if err := st.SetVolumeState(ctx, "nope", VolumeReady); !errdefs.IsNotFound(err) {
		t.Fatalf("state of a missing volume: %v", err)
	}
	if err := st.DeleteVolume(ctx, "v1"); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteVolume(ctx, "v1"); err != nil {
		t.Fatalf("a repeated delete: %v", err)
	}
	if _, err := st.GetVolume(ctx, "data"); !errdefs.IsNotFound(err) {
		t.Fatalf("after delete: %v", err)
	}
}

func TestSecretRecords(t *testing.T) {
	ctx := t.Context()
	st := openTest(t)
	seal := func(v int) []byte { return fmt.Appendf(nil, "sealed-%d", v) }
	for want := 1; want <= 3; want++ {
		sc, err := st.PutSecret(ctx, "k", seal)
		if err != nil || sc.Version != want {
			t.Fatalf("put %d: %+v %v", want, sc, err)
		}
	}
	// Version 1 is still used by someone; 2 is not; 3 is current.
	if err := st.PruneSecretVersions(ctx, "k", map[int]bool{1: true}); err != nil {
		t.Fatal(err)
	}
	for v, want := range map[int]bool{1: true, 2: false, 3: true} {
		b, err := st.SecretValue(ctx, "k", v)
		if want != (err == nil) || (want && string(b) != fmt.Sprintf("sealed-%d", v)) {
			t.Errorf("version %d after prune: %q %v (want kept=%v)", v, b, err, want)
		}
	}
	if err := st.PruneSecretVersions(ctx, "k", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := st.SecretValue(ctx, "k", 3); err != nil {
		t.Fatalf("the current version was pruned: %v", err)
	}
	if kc, err := st.KeyCheck(ctx); err != nil || kc != nil {
		t.Fatalf("key check of a new store: %q %v", kc, err)
	}
	if err := st.SetKeyCheck(ctx, []byte("a")); err != nil {
		t.Fatal(err)
	}
	if err := st.SetKeyCheck(ctx, []byte("b")); err != nil {
		t.Fatal(err)
	}
	if kc, _ := st.KeyCheck(ctx); string(kc) != "a" {
		t.Fatalf("the key check was replaced: %q", kc)
	}
	if err := st.DeleteSecret(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetSecret(ctx, "k"); !errdefs.IsNotFound(err) {
		t.Fatalf("after delete: %v", err)
	}
	if _, err := st.SecretValue(ctx, "k", 1); !errdefs.IsNotFound(err) {
		t.Fatalf("versions outlived the secret: %v", err)
	}
}
