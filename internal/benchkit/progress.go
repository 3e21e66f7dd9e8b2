package benchkit

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// Progress reports what a run is doing. On a terminal it rewrites one
// line in place; elsewhere (a log, CI) it writes plain lines, and
// intermediate updates at most every few seconds so logs stay short. A nil
// *Progress is silent.
type Progress struct {
	w        io.Writer
	tty      bool
	mu       sync.Mutex
	lastLine time.Time
	dirty    bool // a transient line is on screen
}

// NewProgress writes to w; tty selects in-place updates.
func NewProgress(w io.Writer, tty bool) *Progress { return &Progress{w: w, tty: tty} }

// plainEvery spaces out intermediate updates when not on a terminal.
const plainEvery = 10 * time.Second

// Update shows a transient status.
func (p *Progress) Update(format string, args ...any) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	msg := fmt.Sprintf(format, args...)
	if p.tty {
		fmt.Fprintf(p.w, "\r\x1b[K%s", msg)
		p.dirty = true
		return
	}
	if time.Since(p.lastLine) >= plainEvery {
		fmt.Fprintln(p.w, msg)
		p.lastLine = time.Now()
	}
}

// Log writes a line that stays.
func (p *Progress) Log(format string, args ...any) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.dirty {
		fmt.Fprint(p.w, "\r\x1b[K")
		p.dirty = false
	}
	fmt.Fprintf(p.w, format+"\n", args...)
	p.lastLine = time.Now()
}

// Clear removes a transient line, before the results are printed.
func (p *Progress) Clear() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.dirty {
		fmt.Fprint(p.w, "\r\x1b[K")
		p.dirty = false
	}
}
