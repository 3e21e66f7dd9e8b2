package e2b

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"connectrpc.com/connect"
	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/front/e2b/envdpb/process"
	"github.com/clade-sandbox/clade/internal/service"
)

// Commands survive a pause: every command started through envd (but a
// PTY's) is a kept command of the sandbox's agent (api.ExecRequest.Keep),
// labelled with what E2B reports of it (keptMeta). A pause ends the
// front's streams of it (as E2B's do) and drops it from the front's table;
// after the resume List shows it again from the agent's list, and the
// first call naming it (Connect, a signal, input) attaches to it: a Connect
// gets the output it made while nobody followed it, then the rest and its
// end.

// keptMeta is a command's E2B description, kept by the agent as its tag.
type keptMeta struct {
	E2B  int               `json:"e2b"` // keptMetaVersion
	Tag  *string           `json:"tag,omitempty"`
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args,omitempty"`
	Envs map[string]string `json:"envs,omitempty"`
	Cwd  *string           `json:"cwd,omitempty"`
	User string            `json:"user,omitempty"`
}

const keptMetaVersion = 1

// maxKeptMeta is the agent's bound on a tag (api.ExecRequest.Tag).
const maxKeptMeta = 16 << 10

// keptTag encodes a command's description; without its envs when they
// would not fit (List then shows none), and empty when even that does not.
func keptTag(tag *string, cfg *process.ProcessConfig, user string) string {
	m := keptMeta{E2B: keptMetaVersion, Tag: tag, Cmd: cfg.GetCmd(), Args: cfg.GetArgs(), Envs: cfg.GetEnvs(), Cwd: cfg.Cwd, User: user}
	b, _ := json.Marshal(m)
	if len(b) > maxKeptMeta {
		m.Envs = nil
		b, _ = json.Marshal(m)
	}
	if len(b) > maxKeptMeta {
		return ""
	}
	return string(b)
}

// parseKeptTag decodes a tag keptTag made; false for any other (a command
// kept by another client of the sandbox, or bytes from inside it).
func parseKeptTag(tag string) (keptMeta, bool) {
	var m keptMeta
	if tag == "" || json.Unmarshal([]byte(tag), &m) != nil || m.E2B != keptMetaVersion || m.Cmd == "" {
		return keptMeta{}, false
	}
	return m, true
}

func (m keptMeta) config() *process.ProcessConfig {
	return &process.ProcessConfig{Cmd: m.Cmd, Args: m.Args, Envs: m.Envs, Cwd: m.Cwd}
}

// kept lists sandbox id's kept commands that envd started, without
// waking it; nil when it is not running or cannot say.
func (s *Server) kept(ctx context.Context, id string) []api.KeptCommand {
	kept, err := s.svc.Kept(ctx, id, service.NoWake)
	if err != nil {
		return nil
	}
	return kept
}

// findProc finds sandbox id's command by sel, in the front's table or
// else among the agent's kept commands, which it then attaches to (once:
// later calls find it in the table). With subscribe, the caller's stream
// is subscribed before an attached command's output starts flowing, so
// it gets all of it.
func (s *Server) findProc(ctx context.Context, id string, sel *process.ProcessSelector, subscribe bool) (*proc, *sub, error) {
	p, err := s.procs.find(id, sel)
	if err == nil || connect.CodeOf(err) != connect.CodeNotFound {
		return s.subscribed(p, subscribe, err)
	}
	t := s.procs
	t.adopt.Lock()
	defer t.adopt.Unlock()
	if p, err := t.find(id, sel); err == nil {
		return s.subscribed(p, subscribe, nil)
	}
	kept, kerr := s.svc.Kept(ctx, id, service.Wake)
	if kerr != nil {
		return nil, nil, err // the table's NotFound
	}
	var k *api.KeptCommand
	var meta keptMeta
	for i := range kept {
		m, ok := parseKeptTag(kept[i].Tag)
		if !ok {
			continue
		}
		switch v := sel.GetSelector().(type) {
		case *process.ProcessSelector_Pid:
			if uint32(kept[i].PID) == v.Pid {
				k, meta = &kept[i], m
			}
		case *process.ProcessSelector_Tag:
			if m.Tag != nil && *m.Tag == v.Tag && kept[i].Exit == nil {
				k, meta = &kept[i], m
			}
		}
		if k != nil {
			break
		}
	}
	if k == nil {
		return nil, nil, err
	}
	gp, aerr := s.svc.Attach(context.WithoutCancel(ctx), id, service.Wake, k.PID, k.Stdin)
	if errdefs.IsNotFound(aerr) {
		return nil, nil, err // collected meanwhile
	}
	if aerr != nil {
		return nil, nil, connectErr(aerr)
	}
	p = &proc{pid: uint32(k.PID), tag: meta.Tag, config: meta.config(), gp: gp, subs: map[*sub]struct{}{}, done: make(chan struct{})}
	var su *sub
	if subscribe {
		su, _ = p.subscribe()
	}
	t.add(id, p)
	go p.run(s, id)
	return p, su, nil
}

func (s *Server) subscribed(p *proc, subscribe bool, err error) (*proc, *sub, error) {
	if err != nil || !subscribe {
		return p, nil, err
	}
	su, ok := p.subscribe()
	if !ok {
		return nil, nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d has ended", p.pid))
	}
	return p, su, nil
}

// listProcs is List's answer: the front's commands and the kept ones it
// does not follow yet (started before a pause), by pid.
func (s *Server) listProcs(ctx context.Context, id string) []*process.ProcessInfo {
	byPID := map[uint32]*process.ProcessInfo{}
	for _, p := range s.procs.list(id) {
		byPID[p.pid] = &process.ProcessInfo{Config: p.config, Pid: p.pid, Tag: p.tag}
	}
	for _, k := range s.kept(ctx, id) {
		m, ok := parseKeptTag(k.Tag)
		if !ok || k.Exit != nil || k.PID <= 0 {
			continue
		}
		if _, seen := byPID[uint32(k.PID)]; !seen {
			byPID[uint32(k.PID)] = &process.ProcessInfo{Config: m.config(), Pid: uint32(k.PID), Tag: m.Tag}
		}
	}
	out := make([]*process.ProcessInfo, 0, len(byPID))
	for _, pid := range slices.Sorted(maps.Keys(byPID)) {
		out = append(out, byPID[pid])
	}
	return out
}
