package sandbox

import (
	"context"
	"log/slog"
	"time"
)

// steps times the parts of one operation for a debug log line (the daemon's
// --log-level debug): where a create's time goes, without a profiler. It
// costs nothing when debug logging is off.
type steps struct {
	on    bool
	start time.Time
	last  time.Time
	attrs []any
}

func newSteps(log *slog.Logger) *steps {
	if !log.Enabled(context.Background(), slog.LevelDebug) {
		return &steps{}
	}
	now := time.Now()
	return &steps{on: true, start: now, last: now}
}

// mark records the time since the previous mark under name.
func (s *steps) mark(name string) {
	if !s.on {
		return
	}
	now := time.Now()
	s.attrs = append(s.attrs, name+"_us", now.Sub(s.last).Microseconds())
	s.last = now
}

// log writes the marks as one debug line.
func (s *steps) log(l *slog.Logger, msg string, args ...any) {
	if !s.on {
		return
	}
	args = append(args, s.attrs...)
	l.Debug(msg, append(args, "total_us", time.Since(s.start).Microseconds())...)
}
