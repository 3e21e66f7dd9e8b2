package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/service"
)

// listLocal is a node's own service with only a list.
type listLocal struct {
	service.Service
	sbs []api.Sandbox
}

func (l *listLocal) List(context.Context) ([]api.Sandbox, error) { return slices.Clone(l.sbs), nil }

// TestListMoveWindow: the cluster's list through node b shows each
// sandbox once, where the directory says it is, across a move's window:
// one given to b that b has not adopted yet is listed (sleeping on b),
// one b is fetching is listed moving on b, b's copy of one given to a
// (fenced, not removed yet) is listed once, on a; a record b wrote of a
// sandbox it removed (the record's delete not through yet) is not listed.
func TestListMoveWindow(t *testing.T) {
	cli := startEtcd(t)
	ca := joinAt(t, cli, "a", "127.0.0.1:1")
	defer ca.Close()
	cb := joinAt(t, cli, "b", "127.0.0.1:2")
	defer cb.Close()
	at := time.Now().UTC()
	sb := func(id, node, state string, i int) api.Sandbox {
		return api.Sandbox{ID: id, Node: node, State: state, Image: "default", CreatedAt: at.Add(time.Duration(i) * time.Second)}
	}
	put := func(r Record) {
		t.Helper()
		b, err := json.Marshal(r)
		if err == nil {
			_, err = cli.Put(t.Context(), sandboxKey(r.ID), string(b))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	put(Record{ID: "mine", Node: "b", State: "running", Epoch: 1, Sandbox: sb("mine", "b", "running", 0)})
	put(Record{ID: "gone", Node: "a", State: "sleeping", Epoch: 2, SleepImage: "sha256:1", Sandbox: sb("gone", "a", "sleeping", 1)})
	put(Record{ID: "given", Node: "b", State: "sleeping", Epoch: 2, SleepImage: "sha256:2", Sandbox: sb("given", "b", "sleeping", 2)})
	put(Record{ID: "claimed", Node: "b", State: StateMoving, Epoch: 3, SleepImage: "sha256:3", Sandbox: sb("claimed", "b", StateMoving, 3)})
	put(Record{ID: "removed", Node: "b", State: "sleeping", Epoch: 1, SleepImage: "sha256:4", Sandbox: sb("removed", "b", "sleeping", 4)})
	cb.setEpoch("removed", 1)
	cb.setEpoch("gone", 1)
	local := &listLocal{sbs: []api.Sandbox{sb("mine", "", "running", 0), sb("gone", "", "sleeping", 1)}}
	s := NewService(cb, local)
	got, err := s.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var each []string
	for _, x := range got {
		each = append(each, fmt.Sprintf("%s@%s:%s", x.ID, x.Node, x.State))
	}
	want := []string{"mine@b:running", "gone@a:sleeping", "given@b:sleeping", "claimed@b:moving"}
	if !slices.Equal(each, want) {
		t.Fatalf("the list through b: %s, want %s", strings.Join(each, " "), strings.Join(want, " "))
	}
}
