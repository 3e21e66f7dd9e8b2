package httpapi

import (
	"context"
	"net/http"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/service"
)

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) error {
	var req api.SnapshotRequest
	if r.ContentLength != 0 {
		if err := decode(r, &req); err != nil {
			return err
		}
	}
	sn, err := s.svc.Snapshot(r.Context(), r.PathValue("id"), req.Name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, sn)
	return nil
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	out, err := s.svc.ListSnapshots(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) error {
	sn, err := s.svc.GetSnapshot(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sn)
	return nil
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) error {
	if err := s.svc.RemoveSnapshot(r.Context(), r.PathValue("id")); err != nil {
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
	var out api.ForkResult
	var err error
	if req.Spread {
		sp, ok := s.svc.(service.Spreader)
		if !ok {
			return errdefs.New(errdefs.InvalidArgument, "spread places a fork's children across a cluster's nodes: this daemon is not in a cluster (clade daemon --cluster)")
		}
		out, err = sp.ForkAcross(r.Context(), req)
	} else {
		out, err = s.svc.Fork(r.Context(), req.Source, req.N)
	}
	if err != nil {
		return err
	}
	var made []string
	for _, c := range out.Children {
		if c.Error == "" {
			made = append(made, c.ID)
		}
	}
	if s.clientGone(w, r, made...) {
		return nil
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) sleep(w http.ResponseWriter, r *http.Request) error {
	var req api.SleepRequest
	if r.ContentLength != 0 {
		if err := decode(r, &req); err != nil {
			return err
		}
	}
	sleep := s.svc.Sleep
	if req.Memory != nil && !*req.Memory {
		sleep = s.svc.SleepFiles
	}
	sb, err := sleep(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.sandboxAPI(sb))
	return nil
}

func (s *Server) wake(w http.ResponseWriter, r *http.Request) error {
	var req api.WakeRequest
	if r.ContentLength != 0 {
		if err := decode(r, &req); err != nil {
			return err
		}
	}
	wake := s.svc.Wake
	if req.Node != "" {
		c, ok := s.svc.(service.Nodes)
		if !ok {
			return errdefs.New(errdefs.InvalidArgument, "node %q: this daemon is not part of a cluster, so a sandbox wakes only here: leave the node out", req.Node)
		}
		wake = func(ctx context.Context, ref string) (api.Sandbox, error) { return c.WakeOn(ctx, ref, req.Node) }
	}
	sb, err := wake(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.sandboxAPI(sb))
	return nil
}
