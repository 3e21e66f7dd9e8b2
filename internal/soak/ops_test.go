package soak_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"math/rand"
	"strings"

	"github.com/clade-sandbox/clade/sdk"
)

func shaHex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// seqContent is what `seq 1 n` prints.
func seqContent(n int) []byte {
	var b bytes.Buffer
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "%d\n", i)
	}
	return b.Bytes()
}

// exitErr makes a non-zero exit an error for the summary and the log.
func exitErr(what string, st sdk.ExitStatus, stderr string) error {
	return &sdk.Error{Code: fmt.Sprintf("exit-%d", st.Code), Message: fmt.Sprintf("%s exited %d: %s", what, st.Code, strings.TrimSpace(stderr))}
}

// opCreate creates a sandbox (sometimes of a built image) and starts its
// counter process.
func (s *soak) opCreate(ctx context.Context, c *sdk.Client, tag string, rng *rand.Rand) (outcome, error) {
	m := s.model
	name := "soak-" + tag
	req := sdk.CreateSandboxRequest{Name: name, MemoryMiB: sbMemMiB, DiskMiB: sbDiskMiB}
	files := map[string]string{}
	m.mu.Lock()
	if len(m.images) > 0 && rng.Intn(3) == 0 {
		req.Image = m.images[rng.Intn(len(m.images))]
		files["/root/b"] = shaHex([]byte("soak\n"))
	}
	m.pendingCreates[name] = true
	m.mu.Unlock()
	got, err := c.CreateSandbox(ctx, req)
	o := classify(ctx, err)
	m.mu.Lock()
	if o != unknown {
		delete(m.pendingCreates, name)
	}
	var sb *sbox
	if o == ok {
		sb = &sbox{id: got.ID, name: name, files: files, maybe: map[string]string{}, state: "running", busy: true}
		m.sbs[got.ID] = sb
	}
	m.mu.Unlock()
	if o != ok {
		return o, err
	}
	var stderr bytes.Buffer
	st, err := c.Exec(ctx, sb.id, sdk.ExecRequest{Cmd: []string{"sh", "-c", counterStart}, Stderr: &stderr})
	o = classify(ctx, err)
	m.mu.Lock()
	defer m.mu.Unlock()
	sb.busy = false
	switch {
	case o == ok && st.Code == 0:
		sb.counter = 1
	case o == ok:
		return failed, exitErr("counter start", st, stderr.String())
	case o == unknown:
		sb.counter = 2
	}
	return o, err
}

// opExecWrite writes a file with a command (waking the sandbox if it
// sleeps): written to a temporary name and renamed, so it is there whole or
// not at all.
func (s *soak) opExecWrite(ctx context.Context, c *sdk.Client, sb *sbox, tag string, rng *rand.Rand) (string, outcome, error) {
	m := s.model
	kind := "exec"
	path := "/root/e-" + tag
	lines := 1 + rng.Intn(20000)
	want := shaHex(seqContent(lines))
	m.mu.Lock()
	wasAsleep := sb.state == "sleeping"
	if wasAsleep {
		kind = "exec-wake"
	}
	sb.maybe[path] = want
	m.mu.Unlock()
	var stdout, stderr bytes.Buffer
	st, err := c.Exec(ctx, sb.id, sdk.ExecRequest{Cmd: []string{"sh", "-c",
		fmt.Sprintf("seq 1 %d > %s.tmp && mv %s.tmp %s && sha256sum %s", lines, path, path, path, path)}, Stdout: &stdout, Stderr: &stderr})
	o := classify(ctx, err)
	m.mu.Lock()
	defer m.mu.Unlock()
	switch o {
	case ok:
		sb.state = "running"
		delete(sb.maybe, path)
		if st.Code != 0 {
			// A full disk: the rename never happened, the file is absent.
			sb.maybe[path] = want
			return kind, failed, exitErr("write", st, stderr.String())
		}
		if got, _, _ := strings.Cut(stdout.String(), " "); got != want {
			s.finding(true, "sandbox %s: %s was written as sha256 %s but reads back as %q", sb.id, path, want, got)
		}
		sb.files[path] = want
	case failed:
		delete(sb.maybe, path)
		if wasAsleep {
			sb.state = ""
		}
	default:
		if wasAsleep {
			sb.state = ""
		}
	}
	return kind, o, err
}

// opCopyIn copies a file of random bytes in.
func (s *soak) opCopyIn(ctx context.Context, c *sdk.Client, sb *sbox, tag string, rng *rand.Rand) (outcome, error) {
	m := s.model
	data := make([]byte, 1+rng.Intn(256<<10))
	rng.Read(data)
	name := "c-" + tag
	path := "/root/" + name
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg})
	_, _ = tw.Write(data)
	_ = tw.Close()
	want := shaHex(data)
	m.mu.Lock()
	wasAsleep := sb.state == "sleeping"
	sb.maybe[path] = want
	m.mu.Unlock()
	err := c.CopyTo(ctx, sb.id, "/root/", &buf)
	o := classify(ctx, err)
	m.mu.Lock()
	defer m.mu.Unlock()
	switch o {
	case ok:
		sb.state = "running"
		delete(sb.maybe, path)
		sb.files[path] = want
	case failed:
		// A refused or failed upload (a full disk) must leave no file, or
		// the check below catches a half-written one.
		if wasAsleep {
			sb.state = ""
		}
	default:
		if wasAsleep {
			sb.state = ""
		}
	}
	return o, err
}

// opCopyOut copies an acknowledged file out and checks its checksum.
func (s *soak) opCopyOut(ctx context.Context, c *sdk.Client, sb *sbox, rng *rand.Rand) (outcome, error) {
	m := s.model
	m.mu.Lock()
	paths := sortedKeys(sb.files)
	path, want := "/etc/os-release", ""
	if len(paths) > 0 {
		path = paths[rng.Intn(len(paths))]
		want = sb.files[path]
	}
	wasAsleep := sb.state == "sleeping"
	m.mu.Unlock()
	rc, err := c.CopyFrom(ctx, sb.id, path)
	var got string
	if err == nil {
		tr := tar.NewReader(rc)
		var hdr *tar.Header
		hdr, err = tr.Next()
		if err == nil {
			h := sha256.New()
			var n int64
			n, err = io.Copy(h, tr)
			got = hex.EncodeToString(h.Sum(nil))
			if err == nil && hdr.Size != n {
				err = fmt.Errorf("cp out of %s: header says %d bytes, read %d", path, hdr.Size, n)
			}
		}
		rc.Close()
	}
	o := classify(ctx, err)
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case o == ok:
		sb.state = "running"
		if want != "" && got != want {
			s.finding(true, "sandbox %s: cp out of %s: sha256 %s, want %s", sb.id, path, got, want)
		}
	case o == failed && want != "" && sdk.IsNotFound(err):
		s.finding(true, "sandbox %s: cp out of acknowledged %s: %v", sb.id, path, err)
	case wasAsleep:
		sb.state = ""
	}
	return o, err
}

// opRemove removes a sandbox.
func (s *soak) opRemove(ctx context.Context, c *sdk.Client, sb *sbox) (outcome, error) {
	err := c.DeleteSandbox(ctx, sb.id)
	o := classify(ctx, err)
	m := s.model
	m.mu.Lock()
	defer m.mu.Unlock()
	switch o {
	case ok:
		delete(m.sbs, sb.id)
	case unknown:
		sb.maybeGone = true
	}
	return o, err
}

// opSnapshot snapshots a running sandbox under a unique name.
func (s *soak) opSnapshot(ctx context.Context, c *sdk.Client, sb *sbox, tag string) (outcome, error) {
	m := s.model
	name := "snap-" + tag
	m.mu.Lock()
	p := &snap{name: name, files: maps.Clone(sb.files), counter: sb.counter}
	m.pendingSnaps[name] = p
	m.mu.Unlock()
	got, err := c.SnapshotSandbox(ctx, sb.id, name)
	o := classify(ctx, err)
	m.mu.Lock()
	defer m.mu.Unlock()
	if o != unknown {
		delete(m.pendingSnaps, name)
	}
	if o == ok {
		p.id = got.ID
		m.snaps[got.ID] = p
	}
	return o, err
}

// opSleep puts a running sandbox to sleep; one that fails must still run.
func (s *soak) opSleep(ctx context.Context, c *sdk.Client, sb *sbox) (outcome, error) {
	got, err := c.Sleep(ctx, sb.id)
	o := classify(ctx, err)
	m := s.model
	switch o {
	case ok:
		if got.State != "sleeping" {
			s.finding(false, "sandbox %s: sleep answered state %q", sb.id, got.State)
		}
		m.mu.Lock()
		sb.state = "sleeping"
		m.mu.Unlock()
	case failed:
		// On a full disk the rollback may wait for room (suspending).
		if now, gerr := c.GetSandbox(ctx, sb.id); gerr == nil && now.State != "running" && !(inBetween(now.State) && s.diskFull.Load()) {
			s.finding(now.State == "stopped", "sandbox %s: a failed sleep (%v) left it %s (error %q), want running", sb.id, err, now.State, now.Error)
		}
	case unknown:
		m.mu.Lock()
		sb.state = ""
		m.mu.Unlock()
	}
	return o, err
}

// opWake wakes a sleeping sandbox; one that fails must still sleep.
func (s *soak) opWake(ctx context.Context, c *sdk.Client, sb *sbox) (outcome, error) {
	got, err := c.Wake(ctx, sb.id)
	o := classify(ctx, err)
	m := s.model
	switch o {
	case ok:
		if got.State != "running" {
			s.finding(false, "sandbox %s: wake answered state %q", sb.id, got.State)
		}
		m.mu.Lock()
		sb.state = "running"
		m.mu.Unlock()
	case failed:
		// On a full disk the rollback may wait for room (waking).
		if now, gerr := c.GetSandbox(ctx, sb.id); gerr == nil && now.State != "sleeping" && now.State != "running" && !(inBetween(now.State) && s.diskFull.Load()) {
			s.finding(now.State == "stopped", "sandbox %s: a failed wake (%v) left it %s (error %q), want sleeping", sb.id, err, now.State, now.Error)
		}
		m.mu.Lock()
		sb.state = ""
		m.mu.Unlock()
	case unknown:
		m.mu.Lock()
		sb.state = ""
		m.mu.Unlock()
	}
	return o, err
}

// opForkSandbox forks a running sandbox into one or two children.
func (s *soak) opForkSandbox(ctx context.Context, c *sdk.Client, sb *sbox, rng *rand.Rand) (outcome, error) {
	s.model.mu.Lock()
	files, maybe, counter := maps.Clone(sb.files), maps.Clone(sb.maybe), sb.counter
	s.model.mu.Unlock()
	return s.fork(ctx, c, sb.id, 1+rng.Intn(2), files, maybe, counter, true)
}

// opForkSnapshot forks a snapshot into one or two children.
func (s *soak) opForkSnapshot(ctx context.Context, c *sdk.Client, sn *snap, rng *rand.Rand) (outcome, error) {
	return s.fork(ctx, c, sn.id, 1+rng.Intn(2), maps.Clone(sn.files), map[string]string{}, sn.counter, false)
}

func (s *soak) fork(ctx context.Context, c *sdk.Client, source string, n int, files, maybe map[string]string, counter int, implicit bool) (outcome, error) {
	res, err := c.Fork(ctx, source, n)
	o := classify(ctx, err)
	m := s.model
	m.mu.Lock()
	defer m.mu.Unlock()
	switch o {
	case ok:
		if implicit && res.Snapshot != "" {
			m.snaps[res.Snapshot] = &snap{id: res.Snapshot, files: files, counter: counter, implicit: true}
		}
		var errs []string
		for _, ch := range res.Children {
			if ch.ID == "" {
				errs = append(errs, ch.Code+": "+ch.Error)
				continue
			}
			m.sbs[ch.ID] = &sbox{id: ch.ID, files: maps.Clone(files), maybe: maps.Clone(maybe), counter: counter, state: "running"}
		}
		if len(errs) == len(res.Children) {
			return failed, &sdk.Error{Code: "children", Message: strings.Join(errs, "; ")}
		}
	case unknown:
		m.unknownForks++
	}
	return o, err
}

// opRemoveSnapshot removes an explicit snapshot (refused while children
// use it).
func (s *soak) opRemoveSnapshot(ctx context.Context, c *sdk.Client, sn *snap) (outcome, error) {
	err := c.DeleteSnapshot(ctx, sn.id)
	o := classify(ctx, err)
	m := s.model
	m.mu.Lock()
	defer m.mu.Unlock()
	switch o {
	case ok:
		delete(m.snaps, sn.id)
	case unknown:
		sn.maybeGone = true
	}
	return o, err
}

// opBuild builds an image through POST /v1/builds.
func (s *soak) opBuild(ctx context.Context, c *sdk.Client, tag string) (outcome, error) {
	name := "soak-img-" + tag
	_, err := c.Build(ctx, sdk.BuildRequest{Name: name, From: "default", Run: []string{"echo soak > /root/b"}})
	o := classify(ctx, err)
	m := s.model
	m.mu.Lock()
	defer m.mu.Unlock()
	switch o {
	case ok:
		m.images = append(m.images, name)
	case unknown:
		m.maybeImages = append(m.maybeImages, name)
		m.unknownBuilds++
	case failed:
		m.failedBuilds++
	}
	return o, err
}
