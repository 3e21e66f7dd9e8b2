package e2b

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/service"
)

// lookupService is a service.Service whose Image and Create only are
// served (any other call panics: the create of a known root makes none):
// it records whether each Image lookup asked for the image's users.
type lookupService struct {
	service.Service
	img api.Image

	mu        sync.Mutex
	lookups   int
	withUsers int
	created   []api.CreateSandboxRequest
}

func (f *lookupService) Image(ctx context.Context, ref string) (api.Image, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lookups++
	if service.UsersWanted(ctx) {
		f.withUsers++
	}
	img := f.img
	img.UsedBy = []string{"sandbox 0123456789abcdef"}
	return img, nil
}

func (f *lookupService) Create(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.created = append(f.created, req)
	return api.Sandbox{ID: "fedcba9876543210", Image: req.Image, State: stateRunning, TimeoutMS: req.TimeoutMS, OnTimeout: req.OnTimeout}, nil
}

// TestBaseCreateReadsNoUsers: a create of `base` on a root known to hold
// E2B's account looks its image up without the image's users (a store
// query that held up the claim's write, docs/benchmarks.md), once, and
// makes the sandbox with nothing else asked of the service.
func TestBaseCreateReadsNoUsers(t *testing.T) {
	img := api.Image{Name: "e2b-base", CreatedAt: time.Date(2026, 12, 6, 5, 50, 4, 0, time.UTC)}
	svc := &lookupService{img: img}
	s := &Server{cfg: Config{APIKey: "k", BaseImage: img.Name}, svc: svc, log: slog.New(slog.DiscardHandler), hist: metricsRings{rings: map[string]*ring{}}}
	s.accounts.learn(imageRoot(img))

	req := httptest.NewRequest("POST", "/v2/sandboxes", strings.NewReader(`{"templateID":"base"}`))
	rec := httptest.NewRecorder()
	s.wrap(s.create)(rec, req)
	if rec.Code != http.StatusCreated {
		t.Fatalf("create of base: %d %s", rec.Code, rec.Body)
	}
	var body sandboxBody
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.SandboxID != "fedcba9876543210" || body.TemplateID != DefaultTemplate {
		t.Fatalf("create's answer %s: %+v %v", rec.Body, body, err)
	}
	if svc.lookups != 1 || svc.withUsers != 0 {
		t.Errorf("the create looked its image up %d times, %d of them with its users: want once, without", svc.lookups, svc.withUsers)
	}
	if len(svc.created) != 1 || svc.created[0].Image != img.Name || svc.created[0].TimeoutMS != defaultTimeout.Milliseconds() {
		t.Errorf("creates asked of the service: %+v", svc.created)
	}
}
