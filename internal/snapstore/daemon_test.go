package snapstore_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/snapstore"
	"github.com/clade-sandbox/clade/internal/snapstore/weedtest"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// TestDaemonObjectStore runs a real daemon with --object-store: a sleeping
// sandbox and a snapshot whose local images are lost (removed while the
// daemon was down, as a lost disk or a move to a fresh host would) come
// back from the store: the sandbox wakes with its processes and files, the
// snapshot forks. Against a local directory, and against a real S3 server
// (weed) with the objects encrypted (--encrypt-at-rest).
func TestDaemonObjectStore(t *testing.T) {
	t.Parallel() // a daemon and a weed of their own: their waits overlap another test's
	t.Run("local", func(t *testing.T) {
		t.Parallel() // a daemon of its own
		objectStoreRoundTrip(t, []string{"--object-store", filepath.Join(testenv.TempDir(t), "store")})
	})
	t.Run("s3-encrypted", func(t *testing.T) {
		t.Parallel() // a daemon and a weed of its own
		w := weedtest.Start(t)
		cfg := w.Config("clade-daemon")
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := snapstore.NewS3(ctx, cfg); err != nil { // makes the bucket
			t.Fatal(err)
		}
		creds := filepath.Join(testenv.TempDir(t), "s3.env")
		if err := os.WriteFile(creds, fmt.Appendf(nil, "# weed\nAWS_ACCESS_KEY_ID=%s\nAWS_SECRET_ACCESS_KEY=%s\n", cfg.AccessKey, cfg.SecretKey), 0o600); err != nil {
			t.Fatal(err)
		}
		objectStoreRoundTrip(t, []string{"--object-store", "s3://clade-daemon/node1?endpoint=" + w.Endpoint,
			"--object-store-credentials", creds, "--encrypt-at-rest"})
	})
}

func objectStoreRoundTrip(t *testing.T, args []string) {
	d := testenv.StartDaemon(t, args...)
	c := d.Client
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	out := func(id string, cmd string) string {
		t.Helper()
		var b bytes.Buffer
		st, err := c.Exec(ctx, id, sdk.ExecRequest{Cmd: []string{"/bin/sh", "-c", cmd}, Stdout: &b, Stderr: &b})
		if err != nil || st.Code != 0 {
			t.Fatalf("%s: %v %+v: %s", cmd, err, st, b.String())
		}
		return b.String()
	}
	sb, err := c.CreateSandbox(ctx, sdk.CreateSandboxRequest{MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	out(sb.ID, "echo kept > /root/mark; (sleep 100000 &) ; true")
	sn, err := c.SnapshotSandbox(ctx, sb.ID, "stored")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Sleep(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	objects := filepath.Join(d.DataDir, "objects")
	waitFor(t, filepath.Join(objects, "sleep_"+sb.ID+".json"), filepath.Join(objects, "snapshot_"+sn.ID+".json"))

	// The host loses the local images (in the daemon's plain view when
	// they are encrypted at rest), and the daemon restarts.
	lost := 0
	for _, dir := range []string{filepath.Join(d.DataDir, "sleep", sb.ID), filepath.Join(d.DataDir, "snapshots", sn.ID),
		filepath.Join(d.DataDir, "plain", "sleep", sb.ID), filepath.Join(d.DataDir, "plain", "snapshots", sn.ID)} {
		if _, err := os.Stat(dir); err == nil {
			lost++
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
	}
	if lost != 2 {
		t.Fatalf("removed %d local images, want the sleep image and the snapshot", lost)
	}
	d.Stop()
	d.Start(nil)
	got, err := c.GetSandbox(ctx, sb.ID)
	if err != nil || got.State != "sleeping" {
		t.Fatalf("after the restart the sandbox is %+v (%v), want sleeping: its image is in the store", got, err)
	}
	if _, err := c.Wake(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if s := out(sb.ID, "cat /root/mark; grep -qx sleep /proc/[0-9]*/comm && echo running"); s != "kept\nrunning\n" {
		t.Fatalf("woken from the store: %q", s)
	}
	if _, err := os.Stat(filepath.Join(objects, "sleep_"+sb.ID+".json")); !os.IsNotExist(err) {
		t.Fatalf("the copy of a woken sandbox's sleep image is still claimed: %v", err)
	}
	fr, err := c.Fork(ctx, sn.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range fr.Children {
		if ch.ID == "" {
			t.Fatalf("fork of the fetched snapshot: %s", ch.Error)
		}
		if s := out(ch.ID, "cat /root/mark"); s != "kept\n" {
			t.Fatalf("child %s: %q", ch.ID, s)
		}
		if err := c.DeleteSandbox(ctx, ch.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.DeleteSnapshot(ctx, sn.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(objects, "snapshot_"+sn.ID+".json")); !os.IsNotExist(err) {
		t.Fatalf("a deleted snapshot's copy is still claimed: %v", err)
	}
}

// waitFor waits until every path exists (the background copies' records).
func waitFor(t *testing.T, paths ...string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for _, p := range paths {
		for {
			if _, err := os.Stat(p); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s did not appear: the copy was not made", strings.TrimPrefix(p, filepath.Dir(filepath.Dir(p))+"/"))
			}
			time.Sleep(50 * time.Millisecond) // polling for a background copy's record
		}
	}
}
