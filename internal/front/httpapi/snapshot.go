package httpapi

import (
	"net/http"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/store"
)

func snapshotToAPI(sn store.Snapshot, users []string) api.Snapshot {
	return api.Snapshot{ID: sn.ID, Name: sn.Name, Node: sn.Node, Sandbox: sn.Sandbox, Image: sn.Image, MemoryMiB: sn.MemoryMiB, CPUs: sn.CPUs,
		SizeBytes: sn.SizeBytes, CreatedAt: sn.CreatedAt.UTC(), Implicit: sn.Implicit, UsedBy: users}
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) error {
	var req api.SnapshotRequest
	if r.ContentLength != 0 {
		if err := decode(r, &req); err != nil {
			return err
		}
	}
	sn, err := s.mgr.Snapshot(r.Context(), r.PathValue("id"), req.Name, false)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, snapshotToAPI(sn, nil))
	return nil
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	snaps, err := s.mgr.ListSnapshots(r.Context())
	if err != nil {
		return err
	}
	out := make([]api.Snapshot, 0, len(snaps))
	for _, sn := range snaps {
		if sn.State != store.SnapshotReady {
			continue
		}
		_, users, err := s.mgr.GetSnapshot(r.Context(), sn.ID)
		if err != nil {
			return err
		}
		out = append(out, snapshotToAPI(sn, users))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) error {
	sn, users, err := s.mgr.GetSnapshot(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, snapshotToAPI(sn, users))
	return nil
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) error {
	if err := s.mgr.DeleteSnapshot(r.Context(), r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request) error {
	var req api.ForkRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Source == "" {
		return errdefs.New(errdefs.InvalidArgument, "source is empty: name a snapshot or a running sandbox")
	}
	res, err := s.mgr.Fork(r.Context(), req.Source, req.N)
	if err != nil {
		return err
	}
	var made []string
	for _, c := range res.Children {
		if c.Err == nil {
			made = append(made, c.ID)
		}
	}
	if s.clientGone(w, r, made...) {
		return nil
	}
	out := api.ForkResult{Snapshot: res.Snapshot, Children: make([]api.ForkChild, len(res.Children))}
	for i, c := range res.Children {
		out.Children[i] = api.ForkChild{ID: c.ID}
		if c.Err != nil {
			out.Children[i] = api.ForkChild{Error: c.Err.Error(), Code: string(errdefs.ClassOf(c.Err))}
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) sleep(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.mgr.Sleep(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.sandboxAPI(sb))
	return nil
}

func (s *Server) wake(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.mgr.Wake(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.sandboxAPI(sb))
	return nil
}
