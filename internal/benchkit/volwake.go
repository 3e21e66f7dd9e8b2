package benchkit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/clade-sandbox/clade/sdk"
)

// writerScript appends a line to DIR/log every 10 ms, fsyncing each: an
// app whose state is on disk.
const writerScript = `nohup python3 -c '
import os, sys, time
f = open(sys.argv[1] + "/log", "a")
while True:
    f.write("x" * 100 + "\n"); f.flush(); os.fsync(f.fileno())
    time.sleep(0.01)
' "$0" > /dev/null 2>&1 &`

// phaseVolwake: an app writing to a volume is slept and woken until it
// answers, against the same app writing to its own files. The series put
// the sandbox with the volume on the clade side and the one without on the
// baseline side, so their ratio is the volume's cost (target <= 1.2).
func (r *runner) phaseVolwake(ctx context.Context, ph *Phase) {
	t := r.clade
	vol := t.name()
	if _, err := t.c.CreateVolume(ctx, sdk.CreateVolumeRequest{Name: vol, SizeBytes: 256 << 20}); err != nil {
		ph.Error = fmt.Sprintf("volwake: create volume: %v", err)
		return
	}
	var ids []string
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		var errs []error
		for _, id := range ids {
			errs = append(errs, t.remove(cctx, id))
		}
		if err := t.c.DeleteVolume(cctx, vol); err != nil && !sdk.IsNotFound(err) {
			errs = append(errs, err)
		}
		if err := errors.Join(errs...); err != nil {
			ph.Error = joinMsg(ph.Error, "cleanup: "+err.Error())
		}
	}()
	start := func(volumes []sdk.VolumeMount, dir string) (string, error) {
		sb, err := t.c.CreateSandbox(ctx, sdk.CreateSandboxRequest{Name: t.name(), Image: t.image, MemoryMiB: t.memoryMiB, Volumes: volumes})
		if err != nil {
			return "", fmt.Errorf("create: %w", err)
		}
		t.add("sandbox", sb.ID)
		ids = append(ids, sb.ID)
		st, err := t.c.Exec(ctx, sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", writerScript, dir}})
		if err == nil && st.Code != 0 {
			err = fmt.Errorf("exit %d", st.Code)
		}
		if err != nil {
			return "", fmt.Errorf("start the writer in %s: %w", sb.ID, err)
		}
		return sb.ID, nil
	}
	cycle := func(id string) sampleFunc {
		return func(ctx context.Context) ([]time.Duration, error) {
			s := time.Now()
			if err := t.sleep(ctx, id); err != nil {
				return nil, err
			}
			slept := time.Since(s)
			s = time.Now()
			err := t.wake(ctx, id)
			return []time.Duration{slept, time.Since(s)}, err
		}
	}
	withVol, err := start([]sdk.VolumeMount{{Name: vol, Path: "/data"}}, "/data")
	if err != nil {
		ph.Error = err.Error()
		return
	}
	plain, err := start(nil, "/root")
	if err != nil {
		ph.Error = err.Error()
		return
	}
	series, errs := r.measure(ctx, "volwake", []string{"sleep, volume (baseline: none)", "wake to answering, volume (baseline: none)"},
		[2]sampleFunc{cycle(withVol), cycle(plain)})
	ph.Latency = append(ph.Latency, series...)
	ph.record(errs)
}
