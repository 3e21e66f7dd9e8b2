package httpapi

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/engine"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/store"
)

// statsParallel bounds the engine readings of one GET /v1/stats taken at
// once (a reading may start a process, e.g. `runsc ps`).
const statsParallel = 4

// getStats answers GET /v1/sandboxes/{id}/stats. A reading never wakes a
// sleeping sandbox nor counts as its use.
func (s *Server) getStats(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.mgr.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	st, err := s.readStats(r.Context(), sb)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

// listStats answers GET /v1/stats: a reading of every sandbox, or of those
// named by ?id= (repeatable, ids or names), or of those with ?label=K=V.
func (s *Server) listStats(w http.ResponseWriter, r *http.Request) error {
	want, err := labelFilter(r)
	if err != nil {
		return err
	}
	var sbs []store.Sandbox
	if ids := r.URL.Query()["id"]; len(ids) > 0 {
		for _, ref := range ids {
			sb, err := s.mgr.Get(r.Context(), ref)
			if err != nil {
				return err
			}
			sbs = append(sbs, sb)
		}
	} else {
		all, err := s.mgr.List(r.Context())
		if err != nil {
			return err
		}
		for _, sb := range all {
			if hasLabels(sb.Opts.Labels, want) {
				sbs = append(sbs, sb)
			}
		}
	}
	out := make([]api.SandboxStats, len(sbs))
	errs := make([]error, len(sbs))
	sem := make(chan struct{}, statsParallel)
	var wg sync.WaitGroup
	for i, sb := range sbs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			out[i], errs[i] = s.readStats(r.Context(), sb)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// readStats reads sb's use from the engine. A sandbox that is not running,
// or that stops while it is read, gets a reading with no use.
func (s *Server) readStats(ctx context.Context, sb store.Sandbox) (api.SandboxStats, error) {
	out := api.SandboxStats{ID: sb.ID, Name: sb.Name, State: sb.State, CPUs: sb.CPUs,
		MemoryLimitBytes: uint64(sb.MemoryMiB) << 20, ReadAt: time.Now().UTC()}
	statser, ok := s.mgr.Engine().(engine.Statser)
	if !ok {
		return out, errdefs.New(errdefs.Unavailable, "the %s engine cannot read sandboxes' resource use", s.mgr.Engine().Name())
	}
	if sb.State != store.StateRunning {
		return out, nil
	}
	st, err := statser.Stats(ctx, sb.Engine())
	switch {
	case errdefs.ClassOf(err) == errdefs.NotFound:
		return out, nil
	case err != nil:
		return out, err
	}
	out.CPUNanos, out.MemoryBytes, out.Pids = st.CPUNanos, st.MemoryBytes, st.Pids
	if st.MemoryLimitBytes > 0 {
		out.MemoryLimitBytes = st.MemoryLimitBytes
	}
	out.ReadAt = time.Now().UTC()
	return out, nil
}
