package cluster

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// The embedded member's own warnings (a slow disk sync, a request that
// took too long, a lost peer) go to the daemon's log: they are what
// explains a lease that lapses late or a cluster that stalls. Each message
// is written at most once per etcdLogEvery; later repeats are counted and
// the count goes with its next line.
const etcdLogEvery = 10 * time.Second

// etcdLogger is a zap logger that writes etcd's warnings and errors to log.
func etcdLogger(log *slog.Logger) *zap.Logger {
	return zap.New(&etcdCore{log: log, seen: &etcdSeen{last: map[string]time.Time{}, dropped: map[string]int{}}})
}

type etcdSeen struct {
	mu      sync.Mutex
	last    map[string]time.Time
	dropped map[string]int
}

// pass says whether msg is due now, and how many of it were held back.
func (s *etcdSeen) pass(msg string, now time.Time) (bool, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.last[msg]; ok && now.Sub(t) < etcdLogEvery {
		s.dropped[msg]++
		return false, 0
	}
	if len(s.last) > 256 { // etcd's messages are a fixed set; this is only a bound
		clear(s.last)
	}
	s.last[msg] = now
	n := s.dropped[msg]
	delete(s.dropped, msg)
	return true, n
}

type etcdCore struct {
	log    *slog.Logger
	fields []zapcore.Field
	seen   *etcdSeen
}

func (c *etcdCore) Enabled(l zapcore.Level) bool { return l >= zapcore.WarnLevel }

func (c *etcdCore) With(fs []zapcore.Field) zapcore.Core {
	return &etcdCore{log: c.log, fields: append(append([]zapcore.Field(nil), c.fields...), fs...), seen: c.seen}
}

func (c *etcdCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *etcdCore) Write(e zapcore.Entry, fs []zapcore.Field) error {
	ok, dropped := c.seen.pass(e.Message, e.Time)
	if !ok {
		return nil
	}
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range append(append([]zapcore.Field(nil), c.fields...), fs...) {
		f.AddTo(enc)
	}
	attrs := make([]any, 0, 2*len(enc.Fields)+2)
	for k, v := range enc.Fields {
		attrs = append(attrs, k, v)
	}
	if dropped > 0 {
		attrs = append(attrs, "repeats_not_shown", dropped)
	}
	level := slog.LevelWarn
	if e.Level > zapcore.WarnLevel {
		level = slog.LevelError
	}
	c.log.Log(context.Background(), level, "etcd: "+e.Message, attrs...)
	return nil
}

func (c *etcdCore) Sync() error { return nil }

// logLeaders writes each change of the member's view of its leader (none
// included) to log, until the member stops: leader changes renew every
// lease, so a cluster whose leader keeps changing never lets a gone
// node's lease lapse.
func logLeaders(e *embed.Etcd, log *slog.Logger) {
	s := e.Server
	name := func() string {
		id := s.Leader()
		if id == 0 {
			return ""
		}
		if m := s.Cluster().Member(id); m != nil && m.Name != "" {
			return m.Name
		}
		return id.String()
	}
	ch := s.LeaderChangedNotify()
	log.Info("cluster: etcd leader", "leader", name())
	for {
		select {
		case <-ch:
			ch = s.LeaderChangedNotify()
			if lead := name(); lead == "" {
				log.Warn("cluster: the embedded etcd member has no leader")
			} else {
				log.Info("cluster: etcd leader", "leader", lead)
			}
		case <-s.StopNotify():
			return
		}
	}
}
