package httpapi_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// TestExecStreamsUnderLoad: interleaved large stdout and stderr, stdin to
// its EOF, exit codes, and many execs at once on one sandbox, each
// checked byte for byte.
func TestExecStreamsUnderLoad(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	c := d.Client
	sb := newSandbox(t, c, sdk.CreateSandboxRequest{})
	// Interleaved: 1 MiB pieces, alternating streams, each piece numbered.
	py := `import sys
for i in range(24):
    s = sys.stdout if i % 2 == 0 else sys.stderr
    s.buffer.write(bytes([65 + i % 26]) * (1 << 20))
    s.flush()
sys.exit(5)
`
	var want [2]bytes.Buffer
	for i := range 24 {
		want[i%2].Write(bytes.Repeat([]byte{byte(65 + i%26)}, 1<<20))
	}
	var out, errb bytes.Buffer
	st, err := c.Exec(t.Context(), sb.ID, sdk.ExecRequest{Cmd: []string{"python3", "-c", py}, Stdout: &out, Stderr: &errb})
	if err != nil || st.Code != 5 {
		t.Fatalf("interleaved: %+v %v", st, err)
	}
	if !bytes.Equal(out.Bytes(), want[0].Bytes()) || !bytes.Equal(errb.Bytes(), want[1].Bytes()) {
		t.Fatalf("interleaved: stdout %d bytes, stderr %d bytes, want %d and %d or content differs", out.Len(), errb.Len(), want[0].Len(), want[1].Len())
	}
	// Stdin to EOF, 5 MiB.
	in := make([]byte, 5<<20)
	_, _ = rand.Read(in)
	sum := sha256.Sum256(in)
	var so bytes.Buffer
	st, err = c.Exec(t.Context(), sb.ID, sdk.ExecRequest{Cmd: []string{"sha256sum"}, Stdin: bytes.NewReader(in), Stdout: &so})
	if err != nil || st.Code != 0 || !strings.HasPrefix(so.String(), hex.EncodeToString(sum[:])) {
		t.Fatalf("stdin: %+v %v %q", st, err, so.String())
	}
	// 16 at once.
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var o, e bytes.Buffer
			st, err := c.Exec(t.Context(), sb.ID, sdk.ExecRequest{Cmd: []string{"sh", "-c", fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x; echo e%d >&2; exit %d", 300000+i, i, i)}, Stdout: &o, Stderr: &e})
			if err != nil || st.Code != i || o.Len() != 300000+i || strings.Count(o.String(), "x") != 300000+i || e.String() != fmt.Sprintf("e%d\n", i) {
				errs <- fmt.Errorf("exec %d: %+v %v, %d bytes, stderr %q", i, st, err, o.Len(), e.String())
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
