package benchkit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/clade-sandbox/clade/sdk"
)

// AtRestFanout is the width of the atrest phase's fork, unless
// Config.AtRestFanout says otherwise.
const AtRestFanout = 16

// atRestMiB is the atrest phase's volume write, unless Config.AtRestMiB
// says otherwise.
const atRestMiB = 512

// AtRest is the atrest phase's volume throughput: MiB written (and
// fsynced) and read back per second inside a sandbox, into a volume of
// the daemon without encryption and of the one with --encrypt-at-rest.
type AtRest struct {
	MiB            int     `json:"mib"`
	PlainWriteMiBs float64 `json:"plain_write_mib_s"`
	PlainReadMiBs  float64 `json:"plain_read_mib_s"`
	EncWriteMiBs   float64 `json:"encrypted_write_mib_s"`
	EncReadMiBs    float64 `json:"encrypted_read_mib_s"`
	// VolKey*: a volume with a key of its own (volume create --encrypt)
	// on the daemon without --encrypt-at-rest, against PlainWrite/Read's
	// plain volume there.
	VolKeyWriteMiBs float64 `json:"volume_key_write_mib_s"`
	VolKeyReadMiBs  float64 `json:"volume_key_read_mib_s"`
}

// phaseAtrest compares a daemon with --encrypt-at-rest (Config.
// EncryptedHost, on the clade side of every series) with the one the run
// addresses (without it, on the baseline side), sample by sample
// interleaved: wake, fork 16, and sequential write and read of a volume.
// Encryption is per daemon, hence two daemons; both must run on this host
// for the ratios to mean anything.
func (r *runner) phaseAtrest(ctx context.Context, ph *Phase) {
	if r.enc == nil {
		ph.Error = "atrest needs a second daemon started with --encrypt-at-rest (its own --data-dir and --socket): pass its socket with --encrypted-host"
		return
	}
	plain, enc := r.clade, r.enc
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		if err := enc.cleanup(cctx); err != nil {
			ph.Error = joinMsg(ph.Error, "cleanup: "+err.Error())
		}
	}()
	var sides [2]*cladeTarget = [2]*cladeTarget{enc, plain}
	// Wake: one idle sandbox a side, slept untimed, woken until it answers.
	var sleepers [2]string
	for i, t := range sides {
		id, err := t.create(ctx)
		if err != nil {
			ph.Error = fmt.Sprintf("atrest: %v", err)
			return
		}
		sleepers[i] = id
	}
	wake := func(t *cladeTarget, id string) sampleFunc {
		return func(ctx context.Context) ([]time.Duration, error) {
			if err := t.sleep(ctx, id); err != nil {
				return nil, err
			}
			s := time.Now()
			err := t.wake(ctx, id)
			return []time.Duration{time.Since(s)}, err
		}
	}
	series, errs := r.measure(ctx, "atrest wake", []string{"wake, encrypted (baseline: plain)"},
		[2]sampleFunc{wake(enc, sleepers[0]), wake(plain, sleepers[1])})
	ph.Latency = append(ph.Latency, series...)
	ph.record(errs)
	// Fork 16 from one snapshot a side; children removed untimed.
	var snaps [2]string
	for i, t := range sides {
		snap, err := t.snapshot(ctx, sleepers[i])
		if err != nil {
			ph.Error = joinMsg(ph.Error, "atrest: "+err.Error())
			return
		}
		snaps[i] = snap
	}
	fanout := AtRestFanout
	if r.cfg.AtRestFanout > 0 {
		fanout = r.cfg.AtRestFanout
	}
	fork := func(t *cladeTarget, snap string) sampleFunc {
		return func(ctx context.Context) ([]time.Duration, error) {
			s := time.Now()
			ids, err := t.fork(ctx, snap, fanout)
			d := time.Since(s)
			rerr := parallel(ids, 4, func(id string) error { return t.remove(ctx, id) })
			return []time.Duration{d}, errors.Join(err, rerr)
		}
	}
	series, errs = r.measure(ctx, "atrest fork", []string{fmt.Sprintf("fork %d, encrypted (baseline: plain)", fanout)},
		[2]sampleFunc{fork(enc, snaps[0]), fork(plain, snaps[1])})
	ph.Latency = append(ph.Latency, series...)
	ph.record(errs)
	// Volume throughput: write MiB with an fsync, then read it back after
	// a sleep and wake (the volume's host mount is dropped with the sleep,
	// so the read comes through the loop device, and on the encrypted
	// side through gocryptfs).
	mib := atRestMiB
	if r.cfg.AtRestMiB > 0 {
		mib = r.cfg.AtRestMiB
	}
	// The third: an encrypted volume (a key of its own) on the plain
	// daemon.
	var writers [3]string
	var vols [3]string
	owners := [3]*cladeTarget{enc, plain, plain}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		for i, t := range owners {
			if writers[i] != "" {
				_ = t.remove(cctx, writers[i])
			}
			if vols[i] != "" {
				if err := t.c.DeleteVolume(cctx, vols[i]); err != nil && !sdk.IsNotFound(err) {
					ph.Error = joinMsg(ph.Error, "cleanup: "+err.Error())
				}
			}
		}
	}()
	for i, t := range owners {
		vol := t.name()
		if _, err := t.c.CreateVolume(ctx, sdk.CreateVolumeRequest{Name: vol, SizeBytes: int64(2*mib) << 20, Encrypt: i == 2}); err != nil {
			ph.Error = joinMsg(ph.Error, fmt.Sprintf("atrest: create volume: %v", err))
			return
		}
		vols[i] = vol
		sb, err := t.c.CreateSandbox(ctx, sdk.CreateSandboxRequest{Name: t.name(), Image: t.image, MemoryMiB: t.memoryMiB, Volumes: []sdk.VolumeMount{{Name: vol, Path: "/data"}}})
		if err != nil {
			ph.Error = joinMsg(ph.Error, fmt.Sprintf("atrest: create: %v", err))
			return
		}
		t.add("sandbox", sb.ID)
		writers[i] = sb.ID
	}
	io := func(t *cladeTarget, id string) sampleFunc {
		return func(ctx context.Context) ([]time.Duration, error) {
			s := time.Now()
			if err := sh(ctx, t, id, "rm -f /data/f; dd if=/dev/zero of=/data/f bs=1M count="+strconv.Itoa(mib)+" conv=fsync 2>/dev/null"); err != nil {
				return nil, err
			}
			w := time.Since(s)
			if err := t.sleep(ctx, id); err != nil {
				return nil, err
			}
			if err := t.wake(ctx, id); err != nil {
				return nil, err
			}
			s = time.Now()
			if err := sh(ctx, t, id, "dd if=/data/f of=/dev/null bs=1M 2>/dev/null"); err != nil {
				return nil, err
			}
			return []time.Duration{w, time.Since(s)}, nil
		}
	}
	series, errs = r.measure(ctx, "atrest volume", []string{
		fmt.Sprintf("volume write %d MiB + fsync, encrypted (baseline: plain)", mib),
		fmt.Sprintf("volume read %d MiB, encrypted (baseline: plain)", mib)},
		[2]sampleFunc{io(enc, writers[0]), io(plain, writers[1])})
	ph.Latency = append(ph.Latency, series...)
	ph.record(errs)
	rate := func(st *Stats) float64 {
		if st == nil || st.P50 <= 0 {
			return 0
		}
		return round3(float64(mib) / (st.P50 / 1000))
	}
	if len(series) == 2 {
		ph.AtRest = &AtRest{MiB: mib, EncWriteMiBs: rate(series[0].Clade), PlainWriteMiBs: rate(series[0].Baseline),
			EncReadMiBs: rate(series[1].Clade), PlainReadMiBs: rate(series[1].Baseline)}
	}
	// The encrypted volume against the plain one, both on the daemon
	// without --encrypt-at-rest: what a key of the volume's own costs.
	series, errs = r.measure(ctx, "atrest volume key", []string{
		fmt.Sprintf("volume write %d MiB + fsync, volume --encrypt (baseline: plain volume)", mib),
		fmt.Sprintf("volume read %d MiB, volume --encrypt (baseline: plain volume)", mib)},
		[2]sampleFunc{io(plain, writers[2]), io(plain, writers[1])})
	ph.Latency = append(ph.Latency, series...)
	ph.record(errs)
	if len(series) == 2 && ph.AtRest != nil {
		ph.AtRest.VolKeyWriteMiBs, ph.AtRest.VolKeyReadMiBs = rate(series[0].Clade), rate(series[1].Clade)
	}
}

// sh runs a shell command in sandbox id of t and fails on a non-zero exit.
func sh(ctx context.Context, t *cladeTarget, id, cmd string) error {
	st, err := t.c.Exec(ctx, id, sdk.ExecRequest{Cmd: []string{"sh", "-c", cmd}})
	if err == nil && st.Code != 0 {
		err = fmt.Errorf("exit %d %s", st.Code, st.Error)
	}
	if err != nil {
		return fmt.Errorf("%q in %s: %w", cmd, id, err)
	}
	return nil
}
