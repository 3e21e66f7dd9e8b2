package httpapi_test

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/clade-sandbox/clade/internal/tarx"
	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

func TestImageBuildAndTemplate(t *testing.T) {
	d := testenv.StartDaemon(t)
	c := d.Client
	host := t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "app.py"), []byte("print('app')\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	copyApp := sdk.BuildCopy{Dest: "/opt/", Tar: func() (io.ReadCloser, error) {
		var buf bytes.Buffer
		err := tarx.Create(&buf, filepath.Join(host, "app.py"), "app.py")
		return io.NopCloser(&buf), err
	}}

	// A plain image: steps and copies, committed; creates boot it.
	var log bytes.Buffer
	img, err := c.Build(t.Context(), sdk.BuildRequest{Name: "built", From: "default", Copy: []sdk.BuildCopy{copyApp},
		Run: []string{"echo step-one > /root/built", "python3 /opt/app.py > /root/ran"}, Env: []string{"STAGE=built"}, Workdir: "/opt", Output: &log})
	if err != nil {
		t.Fatalf("build: %v\n%s", err, log.String())
	}
	if img.Snapshot != "" || img.Config == nil || img.Config.WorkingDir != "/opt" {
		t.Fatalf("built image: %+v", img)
	}
	sb := newSandbox(t, c, sdk.CreateSandboxRequest{Image: "built"})
	if r := run(t, c, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "cat /root/built /root/ran; echo $STAGE; pwd"}}); r.stdout != "step-one\napp\nbuilt\n/opt\n" {
		t.Fatalf("sandbox of the built image: %+v", r)
	}
	// A failing step stops the build and leaves no image.
	if _, err := c.Build(t.Context(), sdk.BuildRequest{Name: "broken", From: "default", Run: []string{"exit 3"}}); !sdk.IsInvalidArgument(err) {
		t.Fatalf("build with a failing step: %v", err)
	}
	if _, err := c.GetImage(t.Context(), "broken"); !sdk.IsNotFound(err) {
		t.Fatalf("a failed build left an image: %v", err)
	}

	// A template: its start command is already running in every sandbox.
	tmpl, err := c.Build(t.Context(), sdk.BuildRequest{Name: "tmpl", From: "built",
		Start: counterStart, Ready: "test -s /tmp/count"})
	if err != nil {
		t.Fatalf("template build: %v", err)
	}
	if tmpl.Snapshot == "" {
		t.Fatalf("template has no ready snapshot: %+v", tmpl)
	}
	child := newSandbox(t, c, sdk.CreateSandboxRequest{Image: "tmpl"})
	if r := run(t, c, child.ID, sdk.ExecRequest{Cmd: []string{"cat", "/root/built"}}); r.stdout != "step-one\n" {
		t.Fatalf("template sandbox files: %+v", r)
	}
	// Nobody started the counter in this sandbox: it came running.
	waitCountPast(t, c, child.ID, readCount(t, c, child.ID))

	// In use: not removable, but rebuildable; the sandbox of the old
	// template keeps working, the new snapshot serves new creates.
	if err := c.DeleteImage(t.Context(), "tmpl"); !sdk.IsConflict(err) {
		t.Fatalf("removing a template in use: %v", err)
	}
	tmpl2, err := c.Build(t.Context(), sdk.BuildRequest{Name: "tmpl", From: "built", Start: counterStart, Ready: "test -s /tmp/count",
		Run: []string{"echo second > /root/version"}})
	if err != nil {
		t.Fatalf("rebuild while in use: %v", err)
	}
	if tmpl2.Snapshot == tmpl.Snapshot {
		t.Fatal("rebuild kept the old snapshot")
	}
	waitCountPast(t, c, child.ID, readCount(t, c, child.ID))
	if r := run(t, c, child.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", "cat /root/built; cat /root/version 2>/dev/null || echo first"}}); r.stdout != "step-one\nfirst\n" {
		t.Fatalf("the old template's sandbox after the rebuild: %+v", r)
	}
	child2 := newSandbox(t, c, sdk.CreateSandboxRequest{Image: "tmpl"})
	if r := run(t, c, child2.ID, sdk.ExecRequest{Cmd: []string{"cat", "/root/version"}}); r.stdout != "second\n" {
		t.Fatalf("a sandbox of the rebuilt template: %+v", r)
	}
	waitCountPast(t, c, child2.ID, readCount(t, c, child2.ID))
	for _, id := range []string{child.ID, child2.ID} {
		if err := c.DeleteSandbox(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	// The old snapshot went with its last sandbox.
	if _, err := c.GetSnapshot(t.Context(), tmpl.Snapshot); !sdk.IsNotFound(err) {
		t.Fatalf("the replaced template's snapshot is still there: %v", err)
	}
	if err := c.DeleteImage(t.Context(), "tmpl"); err != nil {
		t.Fatalf("removing an unused template: %v", err)
	}
	if snaps, _ := c.ListSnapshots(t.Context()); len(snaps) != 0 {
		t.Fatalf("snapshots left after removing the template: %+v", snaps)
	}
	if err := c.DeleteSandbox(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteImage(t.Context(), "built"); err != nil {
		t.Fatalf("removing the built image: %v", err)
	}
}

// counterStart is counterScript's loop as a template's start command.
const counterStart = `python3 -c '
import os, time
i = 0
while True:
    i += 1
    open("/tmp/count.tmp", "w").write(str(i)); os.rename("/tmp/count.tmp", "/tmp/count")
    time.sleep(0.01)
'`
