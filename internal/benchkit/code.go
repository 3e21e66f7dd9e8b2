package benchkit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/clade-sandbox/clade/sdk"
)

// codeImage is the built-in image of the code interpreter.
const codeImage = "code-interpreter"

// Code is what the code phase found beyond its latency series.
type Code struct {
	// Hot says whether the daemon's hot pool held a code-interpreter
	// sandbox when the phase started (--hot-pool code-interpreter=N).
	Hot bool `json:"hot"`
	// ForkMiB is the DataFrame the forked context held, ForkChildren how
	// many children the fork made and ForkCorrect how many of them
	// answered len(df) right, over all samples.
	ForkMiB      int `json:"fork_mib"`
	ForkRows     int `json:"fork_rows"`
	ForkChildren int `json:"fork_children"`
	ForkCorrect  int `json:"fork_correct"`
}

const (
	codeForkN   = 8
	codeForkMiB = 100
	// codeForkRows x 10 float64 columns is 100 MiB.
	codeForkRows = codeForkMiB << 20 / 80
	// codeMemoryMiB is the limit of the code phase's sandboxes: the
	// kernel, pandas and the DataFrame with room to spare.
	codeMemoryMiB = 1024
)

// phaseCode: the code interpreter through clade's API. runCode("1+1") in
// a warm context, and the floors inside the sandbox (the kernel's own
// round trip over jupyter_client, and the interpreter server's over
// loopback); the first runCode after a create, of the shape the hot pool
// keeps (hot when the daemon pools the image) and of a shape no pool has
// (cold: a fresh environment per sample); a 2,000-row DataFrame's render;
// a fork into 8 of a context holding a 100 MiB DataFrame until every
// child answered len(df), each checked.
func (r *runner) phaseCode(ctx context.Context, ph *Phase) {
	t := r.clade
	c := t.c
	out := &Code{ForkMiB: codeForkMiB, ForkRows: codeForkRows}
	ph.Code = out
	if h, err := c.Health(ctx); err == nil {
		out.Hot = h.Hot > 0 && r.poolsCode(ctx)
		r.waitHot(ctx)
	}
	create := func(ctx context.Context, mib int, env []string) (string, error) {
		sb, err := c.CreateSandbox(ctx, sdk.CreateSandboxRequest{Name: t.name(), Image: codeImage, MemoryMiB: mib, Env: env, Engine: t.engine})
		if err != nil {
			return "", fmt.Errorf("create a %s sandbox: %w", codeImage, err)
		}
		t.add("sandbox", sb.ID)
		return sb.ID, nil
	}
	runCode := func(ctx context.Context, id, code, want string) error {
		ex, err := c.RunCode(ctx, id, sdk.RunCodeRequest{Code: code}, nil)
		if err != nil {
			return fmt.Errorf("run %q in %s: %w", code, id, err)
		}
		if ex.Error != nil {
			return fmt.Errorf("run %q in %s: %s: %s", code, id, ex.Error.Name, ex.Error.Value)
		}
		if want != "" && ex.Text() != want {
			return fmt.Errorf("run %q in %s: got %q, want %q", code, id, ex.Text(), want)
		}
		return nil
	}

	// Warm: one sandbox, its default context used once first.
	id, err := create(ctx, codeMemoryMiB, nil)
	if err == nil {
		err = runCode(ctx, id, "import pandas as pd, numpy as np; 0", "0")
	}
	if err != nil {
		ph.Error = joinMsg(ph.Error, "setup: "+err.Error())
		return
	}
	series, errs := r.measure(ctx, "runCode 1+1", []string{"runCode 1+1"}, [2]sampleFunc{func(ctx context.Context) ([]time.Duration, error) {
		start := time.Now()
		err := runCode(ctx, id, "1+1", "2")
		return []time.Duration{time.Since(start)}, err
	}})
	ph.Latency = append(ph.Latency, series...)
	ph.record(errs)
	floors, err := r.codeFloors(ctx, id)
	if err != nil {
		ph.Error = joinMsg(ph.Error, "floors: "+err.Error())
	}
	ph.Latency = append(ph.Latency, floors...)

	// A 2,000-row DataFrame rendered (HTML and text).
	if err := runCode(ctx, id, "df2k = pd.DataFrame(np.random.rand(2000, 8), columns=list('abcdefgh')); 0", "0"); err != nil {
		ph.Error = joinMsg(ph.Error, err.Error())
	} else {
		series, errs = r.measure(ctx, "DataFrame 2000 rows", []string{"DataFrame 2000 rows"}, [2]sampleFunc{func(ctx context.Context) ([]time.Duration, error) {
			start := time.Now()
			ex, err := c.RunCode(ctx, id, sdk.RunCodeRequest{Code: "df2k"}, nil)
			d := time.Since(start)
			if err == nil && (len(ex.Results) == 0 || !strings.Contains(ex.Results[0].HTML, "<table") || !strings.Contains(ex.Text(), "2000 rows")) {
				err = errors.New("the DataFrame came back without its HTML table or its text")
			}
			return []time.Duration{d}, err
		}})
		ph.Latency = append(ph.Latency, series...)
		ph.record(errs)
	}
	_ = t.remove(ctx, id)

	// First runCode after a create: the plain create's shape (what the
	// hot pool keeps), then one no pool has.
	first := func(hot bool, env func() []string) sampleFunc {
		return func(ctx context.Context) ([]time.Duration, error) {
			if hot {
				// A hot sample is a claim of a warmed sandbox: the pool's
				// refill (a kernel start, seconds on a loaded host) is
				// waited for, outside the sample.
				r.waitHot(ctx)
			}
			start := time.Now()
			id, err := create(ctx, 0, env())
			if err != nil {
				return nil, err
			}
			created := time.Since(start)
			err = runCode(ctx, id, "1+1", "2")
			total := time.Since(start)
			err = errors.Join(err, t.remove(ctx, id))
			return []time.Duration{total, total - created}, err
		}
	}
	label := "cold"
	if out.Hot {
		label = "hot"
	}
	series, errs = r.measure(ctx, "create + first runCode ("+label+")", []string{"create + first runCode (" + label + ")", "first runCode (" + label + ")"},
		[2]sampleFunc{first(out.Hot, func() []string { return nil })})
	ph.Latency = append(ph.Latency, series...)
	ph.record(errs)
	if out.Hot {
		n := 0
		series, errs = r.measure(ctx, "create + first runCode (cold)", []string{"create + first runCode (cold)", "first runCode (cold)"},
			[2]sampleFunc{first(false, func() []string {
				// A shape of its own per sample: missed once, never learned.
				n++
				return []string{"CLADE_BENCH_COLD=" + strconv.Itoa(n) + "-" + t.prefix}
			})})
		ph.Latency = append(ph.Latency, series...)
		ph.record(errs)
	}

	// Fork of a context holding 100 MiB into 8.
	id, err = create(ctx, codeMemoryMiB, nil)
	if err == nil {
		err = runCode(ctx, id, fmt.Sprintf("import pandas as pd, numpy as np\ndf = pd.DataFrame(np.random.rand(%d, 10))\nint(df.memory_usage(index=False).sum()) >> 20", codeForkRows), strconv.Itoa(codeForkMiB))
	}
	if err != nil {
		ph.Error = joinMsg(ph.Error, "fork setup: "+err.Error())
		return
	}
	samples := min(r.cfg.Samples, 3)
	cfg := r.cfg
	r.cfg.Samples, r.cfg.Warmup = samples, 0
	name := fmt.Sprintf("fork %d MiB context into %d", codeForkMiB, codeForkN)
	series, errs = r.measure(ctx, name, []string{name}, [2]sampleFunc{func(ctx context.Context) ([]time.Duration, error) {
		start := time.Now()
		res, err := c.Fork(ctx, id, codeForkN)
		if err != nil {
			return nil, fmt.Errorf("fork %s into %d: %w", id, codeForkN, err)
		}
		var ids []string
		for _, ch := range res.Children {
			if ch.ID != "" {
				t.add("sandbox", ch.ID)
				ids = append(ids, ch.ID)
			}
		}
		out.ForkChildren += len(ids)
		var correct atomic.Int64
		err = parallel(ids, codeForkN, func(cid string) error {
			if err := runCode(ctx, cid, "len(df)", strconv.Itoa(codeForkRows)); err != nil {
				return err
			}
			correct.Add(1)
			return nil
		})
		d := time.Since(start)
		out.ForkCorrect += int(correct.Load())
		if len(ids) != codeForkN {
			err = errors.Join(err, fmt.Errorf("fork into %d made %d children", codeForkN, len(ids)))
		}
		err = errors.Join(err, parallel(ids, 4, func(cid string) error { return t.remove(ctx, cid) }))
		return []time.Duration{d}, err
	}})
	r.cfg.Samples, r.cfg.Warmup = cfg.Samples, cfg.Warmup
	ph.Latency = append(ph.Latency, series...)
	ph.record(errs)
}

// poolsCode reports whether the daemon keeps hot code-interpreter
// sandboxes: a create claims one in milliseconds, which the phase checks
// with a create it times (the pool refills before the samples).
func (r *runner) poolsCode(ctx context.Context) bool {
	start := time.Now()
	sb, err := r.clade.c.CreateSandbox(ctx, sdk.CreateSandboxRequest{Name: r.clade.name(), Image: codeImage, Engine: r.clade.engine})
	if err != nil {
		return false
	}
	r.clade.add("sandbox", sb.ID)
	d := time.Since(start)
	_ = r.clade.remove(ctx, sb.ID)
	return d < 50*time.Millisecond
}

// codeFloorScript measures, inside the sandbox, n round trips of "1+1"
// to a kernel of its own over jupyter_client (the kernel's floor) and to
// the interpreter server over loopback (the server's), and prints both
// lists in milliseconds as JSON.
const codeFloorScript = `
import json, sys, time, urllib.request
from jupyter_client.manager import start_new_kernel
n = int(sys.argv[1])
km, kc = start_new_kernel(kernel_name="python3")
def kernel():
    msg = kc.execute("1+1")
    while True:
        m = kc.get_iopub_msg(timeout=10)
        if m["parent_header"].get("msg_id") == msg and m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
            return
k = []
for i in range(n + 3):
    t = time.perf_counter(); kernel(); d = time.perf_counter() - t
    if i >= 3: k.append(d * 1000)
kc.stop_channels(); km.shutdown_kernel(now=True)
s = []
body = json.dumps({"code": "1+1"}).encode()
for i in range(n + 3):
    t = time.perf_counter()
    req = urllib.request.Request("http://127.0.0.1:49999/execute", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r: r.read()
    d = time.perf_counter() - t
    if i >= 3: s.append(d * 1000)
print(json.dumps({"kernel": k, "server": s}))
`

// codeFloors runs codeFloorScript in sandbox id.
func (r *runner) codeFloors(ctx context.Context, id string) ([]Series, error) {
	var stdout, stderr strings.Builder
	st, err := r.clade.c.Exec(ctx, id, sdk.ExecRequest{Cmd: []string{"python3", "-c", codeFloorScript, strconv.Itoa(r.cfg.Samples)}, Stdout: &stdout, Stderr: &stderr})
	if err == nil && st.Code != 0 {
		err = fmt.Errorf("exit %d: %s", st.Code, tail(stderr.String(), 500))
	}
	if err != nil {
		return nil, err
	}
	var got struct{ Kernel, Server []float64 }
	if err := json.Unmarshal([]byte(stdout.String()), &got); err != nil {
		return nil, fmt.Errorf("floor script: %w: %q", err, tail(stdout.String(), 200))
	}
	dur := func(ms []float64) []time.Duration {
		out := make([]time.Duration, len(ms))
		for i, v := range ms {
			out[i] = time.Duration(v * float64(time.Millisecond))
		}
		return out
	}
	return []Series{
		{Name: "kernel 1+1 (in sandbox, jupyter_client)", Clade: Summarize(dur(got.Kernel))},
		{Name: "server 1+1 (in sandbox, loopback)", Clade: Summarize(dur(got.Server))},
	}, nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
