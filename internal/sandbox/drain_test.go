package sandbox

import (
	"testing"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/store"
)

// TestAdoptFits: a sandbox moved to a node is held to that node's
// --max-memory and --max-cpus; one above either is refused (the cluster
// then gives it to another node), one at the limits is taken.
func TestAdoptFits(t *testing.T) {
	mv := &Mover{m: &Manager{cfg: Config{MaxMemoryMiB: 768, MaxCPUs: 2}}}
	for _, c := range []struct {
		mib  int
		cpus float64
		ok   bool
	}{{768, 2, true}, {512, 1, true}, {1024, 1, false}, {512, 2.5, false}, {769, 0, false}} {
		err := mv.fits(store.Sandbox{ID: "0123456789abcdef", MemoryMiB: c.mib, CPUs: c.cpus})
		if (err == nil) != c.ok || err != nil && !errdefs.Is(err, errdefs.ResourceExhausted) {
			t.Errorf("%d MiB, %g CPUs on a node of 768 MiB, 2 CPUs: %v (want taken: %v)", c.mib, c.cpus, err, c.ok)
		}
	}
}
