// Package steps times the parts of one operation for a debug log line (the
// daemon's --log-level debug): where a create's time goes, without a
// profiler. It costs nothing when debug logging is off.
package steps

import (
	"context"
	"log/slog"
	"time"
)

// Steps times one operation's parts.
type Steps struct {
	on    bool
	start time.Time
	last  time.Time
	attrs []any
}

// New starts timing; it measures nothing unless log takes debug lines.
func New(log *slog.Logger) *Steps {
	if !log.Enabled(context.Background(), slog.LevelDebug) {
		return &Steps{}
	}
	now := time.Now()
	return &Steps{on: true, start: now, last: now}
}

// Mark records the time since the previous mark under name.
func (s *Steps) Mark(name string) {
	if !s.on {
		return
	}
	now := time.Now()
	s.attrs = append(s.attrs, name+"_us", now.Sub(s.last).Microseconds())
	s.last = now
}

// Log writes the marks, and the total, as one debug line.
func (s *Steps) Log(l *slog.Logger, msg string, args ...any) {
	if !s.on {
		return
	}
	args = append(args, s.attrs...)
	l.Debug(msg, append(args, "total_us", time.Since(s.start).Microseconds())...)
}
