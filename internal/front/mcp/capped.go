package mcp

import (
	"strconv"
	"unicode/utf8"
)

// capped keeps the first and the last half of at most limit bytes written
// to it and counts the rest: a long output's start says what ran, its end
// how it finished.
type capped struct {
	limit int
	head  []byte
	tail  []byte // a ring of the last limit-limit/2 bytes once head is full
	pos   int    // next write position in tail once it is full
	total int64
}

func newCapped(limit int) *capped { return &capped{limit: limit} }

func (c *capped) Write(p []byte) (int, error) {
	n := len(p)
	c.total += int64(n)
	if room := c.limit/2 - len(c.head); room > 0 {
		k := min(room, len(p))
		c.head = append(c.head, p[:k]...)
		p = p[k:]
	}
	tailMax := c.limit - c.limit/2
	for len(p) > 0 && tailMax > 0 {
		if len(c.tail) < tailMax {
			k := min(tailMax-len(c.tail), len(p))
			c.tail = append(c.tail, p[:k]...)
			p = p[k:]
			continue
		}
		k := copy(c.tail[c.pos:], p)
		c.pos = (c.pos + k) % tailMax
		p = p[k:]
	}
	return n, nil
}

// cut returns how many bytes were dropped from the middle.
func (c *capped) cut() int64 { return c.total - int64(len(c.head)) - int64(len(c.tail)) }

// String returns what was kept, with a marker where bytes were cut. A
// multi-byte character split at a cut is dropped rather than mangled.
func (c *capped) String() string {
	tail := append(append([]byte{}, c.tail[c.pos:]...), c.tail[:c.pos]...)
	n := c.cut()
	if n == 0 {
		return string(c.head) + string(tail)
	}
	head := c.head
	for i := len(head) - 1; i >= 0 && i >= len(head)-utf8.UTFMax; i-- {
		if utf8.RuneStart(head[i]) {
			if !utf8.FullRune(head[i:]) {
				head = head[:i]
			}
			break
		}
	}
	for len(tail) > 0 && !utf8.RuneStart(tail[0]) {
		tail = tail[1:]
	}
	return string(head) + "\n[... " + strconv.FormatInt(n, 10) + " bytes cut ...]\n" + string(tail)
}
