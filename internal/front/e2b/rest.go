package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/url"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/codeint"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/hostmask"
	"github.com/clade-sandbox/clade/internal/service"
	"github.com/clade-sandbox/clade/internal/steps"
)

// DefaultTemplate is the template E2B code asks for by default; it is
// clade's default image.
const DefaultTemplate = "base"

// DefaultImage is the name of clade's lean default image (the image
// package's Default): what a create that names no image boots.
const DefaultImage = "default"

// defaultTimeout is E2B's sandbox timeout when a create names none.
const defaultTimeout = 300 * time.Second

// maxTimeout is the longest timeout clade takes (a sandbox's, an exec's).
const maxTimeout = 366 * 24 * time.Hour

// clade's sandbox states and timeout actions (api.Sandbox's State and
// OnTimeout).
const (
	stateCreating   = "creating"
	stateRunning    = "running"
	stateWaking     = "waking"
	stateSuspending = "suspending"
	stateSleeping   = "sleeping"

	onTimeoutRemove     = "rm"
	onTimeoutSleep      = "sleep"
	onTimeoutSleepFiles = "sleep-files" // E2B's autoPauseMemory: false
)

func (s *Server) routes() {
	for _, p := range []string{"", "/v2"} {
		s.rest.HandleFunc("POST "+p+"/sandboxes", s.wrap(s.create))
		s.rest.HandleFunc("GET "+p+"/sandboxes", s.wrap(s.list))
		s.rest.HandleFunc("POST "+p+"/sandboxes/{id}/connect", s.wrap(s.connect))
	}
	s.rest.HandleFunc("GET /sandboxes/{id}", s.wrap(s.info))
	s.rest.HandleFunc("DELETE /sandboxes/{id}", s.wrap(s.kill))
	s.rest.HandleFunc("POST /sandboxes/{id}/timeout", s.wrap(s.setTimeout))
	s.rest.HandleFunc("POST /sandboxes/{id}/refreshes", s.wrap(s.refresh))
	s.rest.HandleFunc("POST /sandboxes/{id}/pause", s.wrap(s.pause))
	s.rest.HandleFunc("POST /sandboxes/{id}/resume", s.wrap(s.connect))
	s.rest.HandleFunc("GET /sandboxes/{id}/metrics", s.wrap(s.metrics))
	s.rest.HandleFunc("POST /sandboxes/{id}/fork", s.wrap(s.fork))
	s.rest.HandleFunc("POST /sandboxes/{id}/snapshots", s.wrap(s.snapshot))
	s.rest.HandleFunc("GET /snapshots", s.wrap(s.listSnapshots))
	s.rest.HandleFunc("DELETE /templates/{id}", s.wrap(s.deleteTemplate))
	s.rest.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	s.rest.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errdefs.New(errdefs.NotFound, "this E2B endpoint is not served by clade: %s %s (see docs/e2b.md)", r.Method, r.URL.Path))
	})
}

// decodeBody reads an optional JSON body leniently: E2B clients add fields
// with each release, and a field clade does not know must not fail a call.
func decodeBody(r *http.Request, v any) error {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, 1<<20))
	if err != nil {
		return errdefs.New(errdefs.InvalidArgument, "reading the request body: %v", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	if err := json.Unmarshal(body, v); err != nil {
		return errdefs.New(errdefs.InvalidArgument, "malformed JSON body: %v", err)
	}
	return nil
}

type createBody struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	AutoPause           *bool             `json:"autoPause"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *struct {
		AllowOut           []string `json:"allowOut"`
		DenyOut            []string `json:"denyOut"`
		AllowPublicTraffic *bool    `json:"allowPublicTraffic"`
		MaskRequestHost    *string  `json:"maskRequestHost"`
	} `json:"network"`
	VolumeMounts []json.RawMessage `json:"volumeMounts"`
}

// sandboxBody is E2B's Sandbox: what create, connect and fork return.
type sandboxBody struct {
	SandboxID          string `json:"sandboxID"`
	TemplateID         string `json:"templateID"`
	Alias              string `json:"alias,omitempty"`
	ClientID           string `json:"clientID"`
	EnvdVersion        string `json:"envdVersion"`
	EnvdAccessToken    string `json:"envdAccessToken"`
	TrafficAccessToken string `json:"trafficAccessToken,omitempty"`
	Domain             string `json:"domain,omitempty"`
}

// listedBody is E2B's ListedSandbox, and with the extra fields its
// SandboxDetail.
type listedBody struct {
	SandboxID   string            `json:"sandboxID"`
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	ClientID    string            `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int               `json:"memoryMB"`
	DiskSizeMB  int               `json:"diskSizeMB"`
	Metadata    map[string]string `json:"metadata"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`
	Domain      string            `json:"domain,omitempty"`
	Lifecycle   *lifecycleBody    `json:"lifecycle,omitempty"`
}

type lifecycleBody struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

func (s *Server) templateOf(sb api.Sandbox) string {
	if sb.Snapshot != "" && sb.Image == "" {
		return sb.Snapshot
	}
	if sb.Image == s.baseImage() || sb.Image == "" {
		return DefaultTemplate
	}
	if sb.Image == codeint.Image {
		return CodeInterpreterTemplate
	}
	return sb.Image
}

func (s *Server) sandboxBody(sb api.Sandbox) sandboxBody {
	b := sandboxBody{SandboxID: sb.ID, TemplateID: s.templateOf(sb), Alias: sb.Name, ClientID: "clade",
		EnvdVersion: EnvdVersion, EnvdAccessToken: s.accessToken(sb.ID), Domain: s.cfg.Domain}
	if !sb.Public && sb.Ingress != nil {
		b.TrafficAccessToken = sb.Ingress.TrafficToken
	}
	return b
}

// stateOf is a sandbox's E2B state, or "" for one E2B has no name for (it
// died, or is being removed).
func stateOf(sb api.Sandbox) string {
	switch sb.State {
	case stateCreating, stateRunning, stateWaking:
		return "running"
	case stateSuspending, stateSleeping:
		return "paused"
	}
	return ""
}

func (s *Server) listedBody(sb api.Sandbox) listedBody {
	cpus := int(math.Ceil(sb.CPUs))
	if cpus == 0 {
		cpus = runtime.NumCPU()
	}
	// A sandbox without a timeout never ends; E2B's clients want a date.
	end := sb.CreatedAt.AddDate(100, 0, 0)
	if sb.ExpiresAt != nil {
		end = *sb.ExpiresAt
	}
	md := sb.Labels
	if md == nil {
		md = map[string]string{}
	}
	b := listedBody{SandboxID: sb.ID, TemplateID: s.templateOf(sb), Alias: sb.Name, ClientID: "clade", StartedAt: sb.CreatedAt.UTC(), EndAt: end.UTC(),
		CPUCount: cpus, MemoryMB: sb.MemoryMiB, DiskSizeMB: sb.DiskMiB, Metadata: md, State: stateOf(sb), EnvdVersion: EnvdVersion, Domain: s.cfg.Domain}
	if sb.TimeoutMS > 0 {
		b.Lifecycle = &lifecycleBody{OnTimeout: "kill"}
		switch sb.OnTimeout {
		case onTimeoutSleep:
			b.Lifecycle = &lifecycleBody{OnTimeout: "pause", AutoResume: true}
		case onTimeoutSleepFiles:
			// A pause without memory is resumed by connect only, on E2B.
			b.Lifecycle = &lifecycleBody{OnTimeout: "pause"}
		}
	}
	return b
}

// seconds converts an E2B timeout in seconds.
func seconds(n int64) (time.Duration, error) {
	if n < 0 || n > int64(maxTimeout/time.Second) {
		return 0, errdefs.New(errdefs.InvalidArgument, "timeout %d s is out of range: give 1 to %d seconds", n, int64(maxTimeout/time.Second))
	}
	return time.Duration(n) * time.Second, nil
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) error {
	st := steps.New(s.log)
	var req createBody
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	if len(req.VolumeMounts) > 0 {
		return errdefs.New(errdefs.InvalidArgument, "volumeMounts are not supported by clade's E2B front yet: create the sandbox without them")
	}
	creq := api.CreateSandboxRequest{Labels: req.Metadata, Public: true}
	for k, v := range req.EnvVars {
		creq.Env = append(creq.Env, k+"="+v)
	}
	slices.Sort(creq.Env)
	st.Mark("decode")
	base := req.TemplateID == "" || req.TemplateID == DefaultTemplate
	var root string
	if base {
		if img := s.baseImage(); img != DefaultImage {
			creq.Image = img
		}
		root = s.baseRoot(r.Context())
	} else {
		var err error
		if root, err = s.resolveTemplate(r.Context(), req.TemplateID, &creq); err != nil {
			return err
		}
	}
	st.Mark("resolve")
	timeout := defaultTimeout
	if req.Timeout != nil {
		d, err := seconds(*req.Timeout)
		if err != nil {
			return err
		}
		timeout = d
	}
	// The clock runs from when the sandbox is ready, as E2B's does: a
	// root known to hold the account already (accounts.go) needs no setup
	// and is ready once created; otherwise the timeout is set again once
	// the setup is done, and until then the sandbox holds at least
	// setupGrace, so that a short timeout on a loaded host cannot end it
	// (or put it to sleep) in the middle of its setup.
	creq.TimeoutMS = max(timeout, setupGrace).Milliseconds()
	creq.OnTimeout = onTimeoutRemove
	if req.AutoPause != nil && *req.AutoPause {
		creq.OnTimeout = onTimeoutSleep
		if req.AutoPauseMemory != nil && !*req.AutoPauseMemory {
			creq.OnTimeout = onTimeoutSleepFiles
		}
	}
	if req.AllowInternetAccess != nil && !*req.AllowInternetAccess {
		creq.Network = &api.Network{Mode: "none"}
	}
	if n := req.Network; n != nil {
		if len(n.AllowOut) > 0 || len(n.DenyOut) > 0 {
			if creq.Network != nil {
				return errdefs.New(errdefs.InvalidArgument, "network rules need internet access: drop allow_internet_access=false or the rules")
			}
			creq.Network = &api.Network{Mode: "internet", Allow: n.AllowOut, Deny: n.DenyOut}
		}
		if n.AllowPublicTraffic != nil {
			creq.Public = *n.AllowPublicTraffic
		}
		if n.MaskRequestHost != nil {
			// The Host the ingress gives the sandbox's servers.
			if err := hostmask.Check(*n.MaskRequestHost); err != nil {
				return errdefs.New(errdefs.InvalidArgument, "%v", err)
			}
			creq.HostMask = *n.MaskRequestHost
		}
	}
	sb, err := s.svc.Create(r.Context(), creq)
	if err != nil {
		if base && errdefs.IsNotFound(err) && creq.Image != "" {
			return errdefs.New(errdefs.NotFound, "the %q template runs on the image %s, which this daemon does not have: pull or import it, or start the daemon with --e2b-base-image default", DefaultTemplate, creq.Image)
		}
		return err
	}
	st.Mark("create")
	if s.clientGone(r, sb.ID) {
		return nil
	}
	s.watch(sb.ID)
	ready := s.accounts.ready(root)
	if !ready {
		s.prepareUser(r.Context(), sb.ID, root)
		st.Mark("user")
	}
	if !ready || timeout < setupGrace {
		if sb, err = s.timeoutFromNow(r.Context(), sb.ID, timeout); err != nil {
			return err
		}
		st.Mark("timeout")
	}
	writeJSON(w, http.StatusCreated, s.sandboxBody(sb))
	st.Mark("answer")
	st.Log(s.log, "e2b create", "sandbox", sb.ID, "ready", ready)
	return nil
}

// baseImage is the image E2B's `base` template runs on.
func (s *Server) baseImage() string {
	if s.cfg.BaseImage == "" {
		return DefaultImage
	}
	return s.cfg.BaseImage
}

// baseRoot looks up the key of the root of the base template's image
// (accounts.go), "" when it cannot tell. It reads the image's record only
// (service.WithoutUsers): the list of its users is a store query, which
// waits for the store's writes and holds them up, and took more than the
// claim of a hot sandbox (docs/benchmarks.md). The image can be replaced
// between the lookup and the create's own (the create holds the image's
// use, not the lookup): a sandbox made then on a root without E2B's
// account, under the key of one with it, runs commands as the user only
// after an account is made, as one whose setup failed. It takes an image
// replaced within the microseconds between the two.
func (s *Server) baseRoot(ctx context.Context) string {
	img, err := s.svc.Image(service.WithoutUsers(ctx), s.baseImage())
	if err != nil {
		return ""
	}
	return imageRoot(img)
}

// resolveTemplate maps an E2B template other than base onto a clade
// image (by name) or a snapshot (by id or name), and returns the key of
// the root it names (accounts.go), "" for none known.
func (s *Server) resolveTemplate(ctx context.Context, t string, creq *api.CreateSandboxRequest) (string, error) {
	if t == CodeInterpreterTemplate {
		t = codeint.Image
	}
	if sn, err := s.svc.GetSnapshot(ctx, t); err == nil {
		creq.FromSnapshot = t
		return snapshotRoot(sn), nil
	} else if !errdefs.IsNotFound(err) {
		return "", err
	}
	img, err := s.svc.Image(service.WithoutUsers(ctx), t)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return "", errdefs.New(errdefs.NotFound, "template %q not found: name a clade image, snapshot or template (%q is the default image)", t, DefaultTemplate)
		}
		return "", err
	}
	creq.Image = t
	return imageRoot(img), nil
}

// setupGrace is the least time a new sandbox is given for its setup
// before its own timeout starts.
const setupGrace = time.Minute

// userSetup gives the sandbox what E2B code assumes: a user `user` (uid
// 1000) with home /home/user and /bin/bash. It writes the account files
// directly: useradd costs a few hundred milliseconds in a fresh sandbox.
// Commands and files are this user's unless a request names another
// (DefaultUser); the home directory is where relative paths resolve. It
// prints accountReady, and changes nothing, when the root has all that
// already: every sandbox of that root then needs no setup (accounts.go).
const userSetup = `if grep -q '^user:' /etc/passwd 2>/dev/null && [ -d ` + Home + ` ] && [ "$(stat -c %u:%g ` + Home + ` 2>/dev/null)" = 1000:1000 ]; then
echo ` + accountReady + `; exit 0
fi
if ! grep -q '^user:' /etc/passwd 2>/dev/null; then
echo 'user:x:1000:1000::` + Home + `:/bin/bash' >>/etc/passwd
grep -q '^user:' /etc/group 2>/dev/null || echo 'user:x:1000:' >>/etc/group
[ -f /etc/shadow ] && echo 'user:!:20000::::::' >>/etc/shadow
fi
mkdir -p ` + Home + ` && chown 1000:1000 ` + Home

// prepareUser runs userSetup in a new sandbox of root; a failure is
// logged, not fatal: an image without useradd still serves everything
// else.
func (s *Server) prepareUser(ctx context.Context, id, root string) {
	out, _, err := s.run(ctx, id, "/bin/sh", "-c", userSetup)
	if err != nil {
		s.log.Warn("e2b: setting up user `user` failed", "sandbox", id, "err", err)
		return
	}
	if strings.TrimSpace(out) == accountReady {
		s.accounts.learn(root)
	}
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	want := map[string]string{}
	if md := q.Get("metadata"); md != "" {
		vals, err := url.ParseQuery(md)
		if err != nil {
			return errdefs.New(errdefs.InvalidArgument, "bad metadata filter %q: give key=value pairs joined by &, URL-encoded", md)
		}
		for k, v := range vals {
			want[k] = v[len(v)-1]
		}
	}
	states := map[string]bool{}
	for _, v := range q["state"] {
		for _, st := range strings.Split(v, ",") {
			switch st {
			case "running", "paused":
				states[st] = true
			case "":
			default:
				return errdefs.New(errdefs.InvalidArgument, "bad state %q: use running or paused", st)
			}
		}
	}
	v1 := !strings.HasPrefix(r.URL.Path, "/v2/")
	if len(states) == 0 {
		states["running"] = true
		if !v1 {
			states["paused"] = true
		}
	}
	limit := 100
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			return errdefs.New(errdefs.InvalidArgument, "bad limit %q: give 1 to 1000", l)
		}
		limit = n
	}
	asc := false
	switch o := q.Get("order"); o {
	case "", "desc":
	case "asc":
		asc = true
	default:
		return errdefs.New(errdefs.InvalidArgument, "bad order %q: use asc or desc (by start time; desc, newest first, is the default)", o)
	}
	after, err := timeParam(q, "startedAfter")
	if err != nil {
		return err
	}
	before, err := timeParam(q, "startedBefore")
	if err != nil {
		return err
	}
	template := q.Get("template")
	sbs, err := s.svc.List(r.Context())
	if err != nil {
		return err
	}
	// By start time (newest first unless asc), ties by id: a stable
	// order for the page tokens, across the whole list as on E2B.
	order := func(aAt time.Time, aID string, bAt time.Time, bID string) int {
		c := bAt.Compare(aAt)
		if asc {
			c = -c
		}
		if c != 0 {
			return c
		}
		return strings.Compare(aID, bID)
	}
	slices.SortFunc(sbs, func(a, b api.Sandbox) int { return order(a.CreatedAt, a.ID, b.CreatedAt, b.ID) })
	// The token is the place of the page's last sandbox in that order
	// (its start time and id), not the sandbox: the next page starts
	// after that place even once the sandbox is gone (a client that kills
	// what each page lists).
	var fromAt time.Time
	fromID := ""
	if tok := q.Get("nextToken"); tok != "" {
		if fromAt, fromID, err = parsePageToken(tok, sbs); err != nil {
			return err
		}
	}
	out := []listedBody{}
	var last api.Sandbox
	for _, sb := range sbs {
		if fromID != "" && order(sb.CreatedAt, sb.ID, fromAt, fromID) <= 0 {
			continue
		}
		if !states[stateOf(sb)] || !hasAll(sb.Labels, want) {
			continue
		}
		if !after.IsZero() && sb.CreatedAt.Before(after) || !before.IsZero() && sb.CreatedAt.After(before) {
			continue
		}
		if template != "" && !s.isTemplate(sb, template) {
			continue
		}
		if len(out) == limit {
			w.Header().Set("X-Next-Token", pageToken(last))
			break
		}
		out = append(out, s.listedBody(sb))
		last = sb
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// pageToken is the X-Next-Token after sb: its start time (unix
// nanoseconds) and id.
func pageToken(sb api.Sandbox) string {
	return strconv.FormatInt(sb.CreatedAt.UnixNano(), 10) + "." + sb.ID
}

// parsePageToken reads a nextToken: a pageToken, or the bare id of a
// listed sandbox (the tokens of an older clade).
func parsePageToken(tok string, sbs []api.Sandbox) (time.Time, string, error) {
	if ns, id, ok := strings.Cut(tok, "."); ok && id != "" {
		if n, err := strconv.ParseInt(ns, 10, 64); err == nil {
			return time.Unix(0, n), id, nil
		}
	}
	for _, sb := range sbs {
		if sb.ID == tok {
			return sb.CreatedAt, sb.ID, nil
		}
	}
	return time.Time{}, "", errdefs.New(errdefs.InvalidArgument, "bad nextToken %.64q: give the X-Next-Token of the previous page", tok)
}

// timeParam reads the RFC 3339 time of query parameter name (E2B's SDKs
// send toISOString()), or the zero time when it is absent.
func timeParam(q url.Values, name string) (time.Time, error) {
	v := q.Get(name)
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, errdefs.New(errdefs.InvalidArgument, "bad %s %q: give an RFC 3339 time, e.g. 2026-01-02T15:04:05Z", name, v)
	}
	return t, nil
}

// isTemplate tells whether sb was made from template t: the name E2B
// reports for it (templateID), or the clade image or snapshot behind it.
func (s *Server) isTemplate(sb api.Sandbox, t string) bool {
	if s.templateOf(sb) == t {
		return true
	}
	return sb.Image != "" && sb.Image == t || sb.Snapshot != "" && sb.Snapshot == t
}

func hasAll(labels, want map[string]string) bool {
	for k, v := range want {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// get returns the sandbox with E2B's idea of existence: a dead one is gone.
func (s *Server) get(ctx context.Context, id string) (api.Sandbox, error) {
	sb, err := s.svc.Get(ctx, id)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return sb, errdefs.New(errdefs.NotFound, "sandbox %q not found", id)
		}
		return sb, err
	}
	if stateOf(sb) == "" {
		return sb, errdefs.New(errdefs.NotFound, "sandbox %q is %s", id, sb.State)
	}
	s.watch(sb.ID)
	return sb, nil
}

func (s *Server) info(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.get(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.listedBody(sb))
	return nil
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if err := s.svc.Remove(r.Context(), id); err != nil {
		if errdefs.IsNotFound(err) {
			return errdefs.New(errdefs.NotFound, "sandbox %q not found", id)
		}
		return err
	}
	s.procs.forget(id)
	s.forgetMetrics(id)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	if req.Timeout == nil || *req.Timeout < 1 {
		return errdefs.New(errdefs.InvalidArgument, "give timeout: seconds from now, at least 1")
	}
	return s.renew(w, r, *req.Timeout)
}

// refresh is the older clients' keep-alive: {duration} seconds more.
func (s *Server) refresh(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Duration int64 `json:"duration"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	if req.Duration < 1 {
		req.Duration = int64(defaultTimeout / time.Second)
	}
	return s.renew(w, r, req.Duration)
}

func (s *Server) renew(w http.ResponseWriter, r *http.Request, secs int64) error {
	d, err := seconds(secs)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	if _, err := s.get(r.Context(), id); err != nil {
		return err
	}
	if _, err := s.timeoutFromNow(r.Context(), id, d); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		// Memory false (the SDK's keepMemory: false) keeps the files but
		// not the processes: the resume starts the sandbox afresh.
		Memory *bool `json:"memory"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	id := r.PathValue("id")
	sb, err := s.get(r.Context(), id)
	if err != nil {
		return err
	}
	if stateOf(sb) == "paused" {
		return errdefs.New(errdefs.Conflict, "sandbox %s is already paused", id)
	}
	sleep := s.svc.Sleep
	if req.Memory != nil && !*req.Memory {
		sleep = s.svc.SleepFiles
	}
	if _, err := sleep(r.Context(), id); err != nil {
		return err
	}
	s.procs.forget(id)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// connect resumes a paused sandbox (201) or answers for a running one
// (200), renewing its timeout when the body gives one.
func (s *Server) connect(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	id := r.PathValue("id")
	sb, err := s.get(r.Context(), id)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if stateOf(sb) == "paused" {
		if sb, err = s.svc.Wake(r.Context(), id); err != nil {
			return err
		}
		status = http.StatusCreated
	}
	if req.Timeout != nil && *req.Timeout > 0 {
		d, err := seconds(*req.Timeout)
		if err != nil {
			return err
		}
		if extends(sb, time.Now().Add(d)) {
			if sb, err = s.timeoutFromNow(r.Context(), id, d); err != nil {
				return err
			}
		}
	}
	writeJSON(w, status, s.sandboxBody(sb))
	return nil
}

// extends tells whether an end at end would be later than sb's: E2B's
// connect only ever extends a sandbox's time (older SDKs send 300 s on
// every connect). A sandbox without an end keeps none; one whose timer
// is not running (asleep) gets the new end.
func extends(sb api.Sandbox, end time.Time) bool {
	if sb.ExpiresAt != nil {
		return end.After(*sb.ExpiresAt)
	}
	return sb.TimeoutMS > 0
}

// timeoutFromNow sets sandbox id's timeout to d from now, keeping what
// happens at its end.
func (s *Server) timeoutFromNow(ctx context.Context, id string, d time.Duration) (api.Sandbox, error) {
	return s.svc.SetTimeout(ctx, id, api.TimeoutRequest{TimeoutMS: d.Milliseconds()})
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Count   *int   `json:"count"`
		Timeout *int64 `json:"timeout"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	n := 1
	if req.Count != nil {
		n = *req.Count
	}
	if n < 1 {
		return errdefs.New(errdefs.InvalidArgument, "count %d: give the number of children, 1 or more", n)
	}
	id := r.PathValue("id")
	if _, err := s.get(r.Context(), id); err != nil {
		return err
	}
	var timeout time.Duration
	if req.Timeout != nil {
		d, err := seconds(*req.Timeout)
		if err != nil {
			return err
		}
		timeout = d
	}
	res, err := s.svc.Fork(r.Context(), id, n)
	if err != nil {
		return err
	}
	var made []string
	for _, c := range res.Children {
		if c.Error == "" {
			made = append(made, c.ID)
		}
	}
	if s.clientGone(r, made...) {
		return nil
	}
	type result struct {
		Sandbox *sandboxBody `json:"sandbox,omitempty"`
		Error   *apiError    `json:"error,omitempty"`
	}
	out := make([]result, 0, len(res.Children))
	for _, c := range res.Children {
		if c.Error != "" {
			st := statusOf(errdefs.Class(c.Code))
			out = append(out, result{Error: &apiError{Code: st, Message: c.Error}})
			continue
		}
		var sb api.Sandbox
		// Made: a client going away now must not fail these and so
		// leave a child it is told is an error.
		ctx := context.WithoutCancel(r.Context())
		if timeout > 0 {
			sb, err = s.timeoutFromNow(ctx, c.ID, timeout)
		} else {
			sb, err = s.svc.Get(ctx, c.ID)
		}
		if err != nil {
			st := statusOf(errdefs.ClassOf(err))
			out = append(out, result{Error: &apiError{Code: st, Message: err.Error()}})
			continue
		}
		s.watch(sb.ID)
		b := s.sandboxBody(sb)
		out = append(out, result{Sandbox: &b})
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

type snapshotBody struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func snapshotOf(sn api.Snapshot) snapshotBody {
	b := snapshotBody{SnapshotID: sn.ID, Names: []string{}}
	if sn.Name != "" {
		b.Names = append(b.Names, sn.Name)
	}
	return b
}

func (s *Server) snapshot(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Name string `json:"name"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	id := r.PathValue("id")
	if _, err := s.get(r.Context(), id); err != nil {
		return err
	}
	sn, err := s.svc.Snapshot(r.Context(), id, req.Name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, snapshotOf(sn))
	return nil
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	// The service lists ready snapshots only.
	sns, err := s.svc.ListSnapshots(r.Context())
	if err != nil {
		return err
	}
	out := []snapshotBody{}
	for _, sn := range sns {
		if sn.Implicit {
			continue
		}
		if v := q.Get("sandboxID"); v != "" && sn.Sandbox != v {
			continue
		}
		if v := q.Get("name"); v != "" && sn.Name != v {
			continue
		}
		out = append(out, snapshotOf(sn))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// deleteTemplate is how the SDKs delete a snapshot. clade's images are not
// removed through the E2B front.
func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if err := s.svc.RemoveSnapshot(r.Context(), id); err != nil {
		if errdefs.IsNotFound(err) {
			return errdefs.New(errdefs.NotFound, "snapshot %q not found (clade's images are removed with `clade image rm`, not through the E2B API)", id)
		}
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// metrics returns the sandbox's samples from start to end (unix seconds,
// either open): the host's readings every 5 s of the last hour
// (metrics.go), with the disk use read inside the sandbox. A call reads
// the sandbox from inside now (CPU over 200 ms, memory, disk, as the
// sandbox sees itself), which refreshes the disk figure, and answers that
// sample alone while the range reaching now has no history yet (a new
// sandbox, or an engine that cannot read use from the host).
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	start, err := unixParam(q, "start")
	if err != nil {
		return err
	}
	end, err := unixParam(q, "end")
	if err != nil {
		return err
	}
	if !start.IsZero() && !end.IsZero() && end.Before(start) {
		return errdefs.New(errdefs.InvalidArgument, "bad range: end %d is before start %d", end.Unix(), start.Unix())
	}
	id := r.PathValue("id")
	sb, err := s.get(r.Context(), id)
	if err != nil {
		return err
	}
	now := time.Now()
	var fresh *metric
	host := false
	if stateOf(sb) == "running" && (end.IsZero() || !end.Before(now.Add(-metricsEvery))) && (start.IsZero() || !start.After(now)) {
		m, err := s.sample(r.Context(), sb)
		if err != nil {
			// The sample runs /bin/sh inside: a sandbox without one (its
			// user removed it, or an image without a shell) still has
			// what the host reads.
			if m, err = s.hostSample(r.Context(), sb, err); err != nil {
				return err
			}
			host = true
		}
		fresh = &m
	}
	// An end given in whole seconds covers the second it names.
	if !end.IsZero() {
		end = end.Add(time.Second - time.Nanosecond)
	}
	disk := fresh
	if host {
		disk = nil // no disk reading: the ring keeps its last
	}
	out, _ := s.history(id, disk, start, end)
	if len(out) == 0 && fresh != nil {
		out = append(out, *fresh)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// unixParam reads query parameter name as unix seconds (E2B's start and
// end), or the zero time when it is absent.
func unixParam(q url.Values, name string) (time.Time, error) {
	v := q.Get(name)
	if v == "" {
		return time.Time{}, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > 1<<40 {
		return time.Time{}, errdefs.New(errdefs.InvalidArgument, "bad %s %q: give a unix time in seconds", name, v)
	}
	return time.Unix(n, 0), nil
}

// clientGone reports whether the client of r went away (an SDK's request
// timeout, a killed process) before its create or fork answered, and then
// removes the sandboxes ids the call made, as the native API does: the
// client never learned their ids, and they would run, holding their
// memory, until their timeout.
func (s *Server) clientGone(r *http.Request, ids ...string) bool {
	if r.Context().Err() == nil {
		return false
	}
	s.svc.RemoveAbandoned(r.Context(), "e2b "+r.URL.Path, ids...)
	for _, id := range ids {
		s.procs.forget(id)
	}
	return true
}
