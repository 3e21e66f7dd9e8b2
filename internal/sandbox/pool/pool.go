// Package pool keeps prepared engine sandboxes (created, not started) per
// shape, so a create only starts one and a fork or wake only restores into
// one: the slow half of making a sandbox (sandbox and gofer processes,
// seccomp filters) runs ahead of time, one at a time, off the hot path.
//
// Which shapes are kept is learned from demand: a shape a create, fork or
// wake asked for is kept from then on, so a user who always asks for 256 MiB
// gets the same speed as the defaults. Shapes nobody asked for in a while
// (Expire) are dropped, and the prepared sandboxes of all shapes together
// are capped (MaxTotal), the least recently asked-for shapes giving way
// first. Pinned shapes (the daemon's default) stay.
//
// The pool owns its state; what preparing and destroying mean is the
// lifecycle service's business, given as functions.
package pool

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Shape is what a prepared sandbox has to match to be used: the engine made
// it with these resources, this environment and this network mode.
type Shape struct {
	Image     string
	MemoryMiB int
	CPUs      float64
	Env       string // NUL-joined
	DiskMiB   int
	Network   string
	// Engine is the engine that made it ("" the default).
	Engine string
}

// ShapeOf returns the shape of a sandbox.
func ShapeOf(image string, memoryMiB int, cpus float64, env []string, diskMiB int, network string) Shape {
	return Shape{Image: image, MemoryMiB: memoryMiB, CPUs: cpus, Env: strings.Join(env, "\x00"), DiskMiB: diskMiB, Network: network}
}

// EnvList returns the shape's environment as a list.
func (s Shape) EnvList() []string {
	if s.Env == "" {
		return nil
	}
	return strings.Split(s.Env, "\x00")
}

// Config configures a pool.
type Config struct {
	// Limit caps the prepared sandboxes kept per shape; 0 turns the pool off.
	Limit int
	// Prepare makes one prepared sandbox of a shape and returns its engine id.
	Prepare func(ctx context.Context, sh Shape) (string, error)
	// Destroy removes a prepared sandbox nobody took.
	Destroy func(ctx context.Context, id string) error
	// MaxTotal caps the prepared sandboxes of all shapes together; 4 x
	// Limit if zero.
	MaxTotal int
	// Expire drops a shape nobody asked for in this long; 10 min if zero.
	Expire time.Duration
	// RetryAfter is the pause after a failed Prepare; 5 s if zero.
	RetryAfter time.Duration
	// Defer holds back a refill that a Want asked for by this long: the
	// request that took a sandbox answers before the refill's process
	// starts compete with it for the CPUs (a hot-pool claim is a
	// millisecond; a sandbox start is hundreds of CPU-milliseconds). Wants
	// within the pause are served by one pass.
	Defer time.Duration
	Log   *slog.Logger
}

// maxRetryAfter bounds the pause after failed prepares in a row.
const maxRetryAfter = 40 * time.Second

// Pool is a set of prepared sandboxes per shape. Its methods are safe for
// concurrent use.
type Pool struct {
	cfg  Config
	kick chan struct{}

	mu     sync.Mutex
	slots  map[Shape][]string  // guarded by mu
	target map[Shape]int       // guarded by mu
	asked  map[Shape]time.Time // guarded by mu: when each targeted shape was last asked for
	pinned map[Shape]bool      // guarded by mu: never expired nor evicted
	missed map[Shape]time.Time // guarded by mu: untargeted shapes' last miss, by missKey
	failed map[Shape]time.Time // guarded by mu: shapes whose prepare failed, until when to leave them
	fails  map[Shape]int       // guarded by mu: failed prepares in a row, per shape
	closed bool                // guarded by mu: drained; a prepare that finishes now is destroyed
	// preparing counts the prepares under way (Drain waits for them);
	// added to under mu, and only while the pool is open.
	preparing sync.WaitGroup

	hits, misses atomic.Int64
}

// New returns an empty pool; call Run to fill it.
func New(cfg Config) *Pool {
	if cfg.RetryAfter == 0 {
		cfg.RetryAfter = 5 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxTotal == 0 {
		cfg.MaxTotal = 4 * cfg.Limit
	}
	if cfg.Expire == 0 {
		cfg.Expire = 10 * time.Minute
	}
	return &Pool{cfg: cfg, kick: make(chan struct{}, 1), slots: map[Shape][]string{}, target: map[Shape]int{},
		asked: map[Shape]time.Time{}, pinned: map[Shape]bool{}, missed: map[Shape]time.Time{}, failed: map[Shape]time.Time{}, fails: map[Shape]int{}}
}

// Take returns the engine id of a prepared sandbox of shape sh and removes
// it from the pool, or false when there is none. The caller owns the id.
// The second miss of a shape within Expire makes the pool keep one of it
// (a shape asked for once may never come again; twice, it is in use).
func (p *Pool) Take(sh Shape) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := p.slots[sh]
	if len(ids) == 0 {
		p.misses.Add(1)
		p.learnLocked(sh)
		return "", false
	}
	p.hits.Add(1)
	id := ids[len(ids)-1]
	p.slots[sh] = ids[:len(ids)-1]
	return id, true
}

// Want asks for at least n prepared sandboxes of shape sh (at most the
// limit) and wakes the refill loop; Want(sh, 0) only refills what was
// taken. Either way the shape counts as asked for now.
func (p *Pool) Want(sh Shape, n int) {
	p.want(sh, n, false)
}

// Pin is Want for a shape that is kept however long nobody asks for it.
func (p *Pool) Pin(sh Shape, n int) {
	p.want(sh, n, true)
}

func (p *Pool) want(sh Shape, n int, pin bool) {
	p.mu.Lock()
	if n > 0 || p.target[sh] > 0 {
		p.target[sh] = max(p.target[sh], min(n, p.cfg.Limit))
		p.asked[sh] = time.Now()
		if pin {
			p.pinned[sh] = true
		}
		p.capLocked(sh)
	}
	p.mu.Unlock()
	p.kickRun()
}

func (p *Pool) kickRun() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// capLocked lowers the targets of the least recently asked-for shapes
// (never keep's, never a pinned one's) until all targets together fit
// MaxTotal. Guarded by mu.
func (p *Pool) capLocked(keep Shape) {
	total := 0
	for _, n := range p.target {
		total += n
	}
	for total > p.cfg.MaxTotal {
		var victim Shape
		found := false
		for sh := range p.target {
			if sh == keep || p.pinned[sh] {
				continue
			}
			if !found || p.asked[sh].Before(p.asked[victim]) {
				victim, found = sh, true
			}
		}
		if !found {
			return
		}
		total -= p.target[victim]
		p.forgetLocked(victim)
	}
}

// forgetLocked drops a shape's target; trim destroys its prepared
// sandboxes. Guarded by mu.
func (p *Pool) forgetLocked(sh Shape) {
	delete(p.target, sh)
	delete(p.asked, sh)
	delete(p.failed, sh)
	delete(p.fails, sh)
}

// maxMissed bounds the shapes remembered for one miss.
const maxMissed = 1024

// learnLocked records a miss of sh, and targets sh on its second recent
// one. Guarded by mu.
func (p *Pool) learnLocked(sh Shape) {
	if p.target[sh] > 0 || p.cfg.Limit <= 0 {
		return
	}
	now := time.Now()
	key := missKey(sh)
	if t, ok := p.missed[key]; ok && now.Sub(t) < p.cfg.Expire {
		delete(p.missed, key)
		p.target[sh] = 1
		p.asked[sh] = now
		p.capLocked(sh)
		p.kickRun() // its taker may not refill (a hot miss does not)
		return
	}
	if len(p.missed) >= maxMissed {
		clear(p.missed)
	}
	p.missed[key] = now
}

// missKey is sh as the misses remember it: a long environment (up to
// 256 KiB, often secrets) by its digest, so that maxMissed misses hold
// kilobytes, not a quarter of a GiB.
func missKey(sh Shape) Shape {
	if len(sh.Env) > 64 {
		sum := sha256.Sum256([]byte(sh.Env))
		sh.Env = "sha256:" + hex.EncodeToString(sum[:])
	}
	return sh
}

// Stats returns how many takes found a prepared sandbox and how many did
// not, since the pool was made.
func (p *Pool) Stats() (hits, misses int64) {
	return p.hits.Load(), p.misses.Load()
}

// trim expires shapes nobody asked for in Expire and destroys the prepared
// sandboxes beyond their shape's target. It returns when the next shape
// expires (0: none will).
func (p *Pool) trim(ctx context.Context) time.Duration {
	now := time.Now()
	next := time.Duration(0)
	var extra []string
	p.mu.Lock()
	for sh := range p.target {
		if p.pinned[sh] {
			continue
		}
		left := p.asked[sh].Add(p.cfg.Expire).Sub(now)
		if left <= 0 {
			p.cfg.Log.Debug("warm pool: dropping a shape nobody asked for", "image", sh.Image, "memory_mib", sh.MemoryMiB, "network", sh.Network)
			p.forgetLocked(sh)
			continue
		}
		if next == 0 || left < next {
			next = left
		}
	}
	for sh, t := range p.missed {
		if now.Sub(t) >= p.cfg.Expire {
			delete(p.missed, sh)
		}
	}
	for sh, ids := range p.slots {
		if k := p.target[sh]; len(ids) > k {
			extra = append(extra, ids[k:]...)
			p.slots[sh] = ids[:k]
		}
		if len(p.slots[sh]) == 0 {
			delete(p.slots, sh)
		}
	}
	p.mu.Unlock()
	for _, id := range extra {
		if p.cfg.Destroy != nil {
			_ = p.cfg.Destroy(context.WithoutCancel(ctx), id)
		}
	}
	return next
}

// missing returns a shape with fewer prepared sandboxes than wanted whose
// last prepare did not just fail; else how long until one is retried.
func (p *Pool) missing() (Shape, bool, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	retry := time.Duration(0)
	for sh, n := range p.target {
		if len(p.slots[sh]) >= n {
			continue
		}
		if until, ok := p.failed[sh]; ok && now.Before(until) {
			if d := until.Sub(now); retry == 0 || d < retry {
				retry = d
			}
			continue
		}
		return sh, true, 0
	}
	return Shape{}, false, retry
}

func (p *Pool) add(ctx context.Context, sh Shape, id string) {
	p.mu.Lock()
	closed := p.closed
	if !closed {
		delete(p.failed, sh)
		delete(p.fails, sh)
		p.slots[sh] = append(p.slots[sh], id)
	}
	p.mu.Unlock()
	if closed && p.cfg.Destroy != nil {
		// Prepared after Drain: nobody will take it.
		_ = p.cfg.Destroy(context.WithoutCancel(ctx), id)
	}
}

// Run refills the pool one sandbox at a time until ctx ends. A pool with a
// zero limit does nothing.
func (p *Pool) Run(ctx context.Context) {
	if p.cfg.Limit <= 0 || p.cfg.Prepare == nil {
		return
	}
	for {
		expire := p.trim(ctx)
		sh, ok, retry := p.missing()
		if !ok {
			if expire > 0 && (retry == 0 || expire < retry) {
				retry = expire
			}
			var after <-chan time.Time
			if retry > 0 {
				after = time.After(retry)
			}
			select {
			case <-ctx.Done():
				return
			case <-p.kick:
				if p.cfg.Defer > 0 {
					select {
					case <-ctx.Done():
						return
					case <-time.After(p.cfg.Defer):
					}
				}
			case <-after:
			}
			continue
		}
		// Counted while under way, so that Drain waits for it: a daemon
		// that exits under a prepare would leave its sandbox behind (and
		// what its hooks set up for it) until the next start.
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return
		}
		p.preparing.Add(1)
		p.mu.Unlock()
		id, err := p.cfg.Prepare(ctx, sh)
		if err == nil {
			p.add(ctx, sh, id)
		}
		p.preparing.Done()
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return
		}
		// A shape that fails is left alone for a while, without holding up
		// the others: no spinning on a persistent failure. The pause
		// doubles with each failure in a row, up to maxRetryAfter: a
		// pinned image that is being built (minutes) or missing is
		// retried, without a warning every few seconds.
		p.mu.Lock()
		p.fails[sh]++
		wait := p.cfg.RetryAfter << min(p.fails[sh]-1, 8)
		wait = max(min(wait, maxRetryAfter), p.cfg.RetryAfter)
		p.failed[sh] = time.Now().Add(wait)
		p.mu.Unlock()
		p.cfg.Log.Warn("warm pool: prepare failed", "image", sh.Image, "memory_mib", sh.MemoryMiB, "retry_in", wait, "err", err)
	}
}

// Drain destroys every prepared sandbox in the pool and forgets the
// targets. It waits (until ctx ends) for a prepare under way, whose
// sandbox is then destroyed as it is made; no prepare starts after.
func (p *Pool) Drain(ctx context.Context) {
	defer p.waitPrepares(ctx)
	p.mu.Lock()
	var ids []string
	for _, s := range p.slots {
		ids = append(ids, s...)
	}
	p.slots = map[Shape][]string{}
	p.target = map[Shape]int{}
	p.asked = map[Shape]time.Time{}
	p.missed = map[Shape]time.Time{}
	p.closed = true
	p.mu.Unlock()
	slices.Sort(ids)
	for _, id := range ids {
		if p.cfg.Destroy != nil {
			_ = p.cfg.Destroy(ctx, id)
		}
	}
}

// waitPrepares waits until no prepare is under way, or ctx ends. Call it
// once the pool is closed.
func (p *Pool) waitPrepares(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		p.preparing.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		p.cfg.Log.Warn("pool: a prepare under way did not end in time; its sandbox is destroyed when it does, or by the next start")
	}
}

// Flush destroys every prepared sandbox in the pool, keeping the targets
// (the pool refills when its Prepare succeeds again), and returns how many
// it destroyed.
func (p *Pool) Flush(ctx context.Context) int {
	return p.FlushIf(ctx, func(Shape) bool { return true })
}

// FlushIf is Flush for the shapes match accepts (e.g. those of an image
// that was replaced: the sandboxes were made on its former root).
func (p *Pool) FlushIf(ctx context.Context, match func(Shape) bool) int {
	p.mu.Lock()
	var ids []string
	for sh, s := range p.slots {
		if match(sh) {
			ids = append(ids, s...)
			delete(p.slots, sh)
		}
	}
	p.mu.Unlock()
	for _, id := range ids {
		if p.cfg.Destroy != nil {
			_ = p.cfg.Destroy(ctx, id)
		}
	}
	p.kickRun()
	return len(ids)
}

// Put gives back a sandbox of shape sh that Take returned and nobody used.
// It is destroyed when the pool is closed or already holds its shape's
// target.
func (p *Pool) Put(ctx context.Context, sh Shape, id string) {
	p.mu.Lock()
	keep := !p.closed && len(p.slots[sh]) < p.target[sh]
	if keep {
		p.slots[sh] = append(p.slots[sh], id)
	}
	p.mu.Unlock()
	if !keep && p.cfg.Destroy != nil {
		_ = p.cfg.Destroy(context.WithoutCancel(ctx), id)
	}
}

// Len returns how many prepared sandboxes wait in the pool.
func (p *Pool) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, s := range p.slots {
		n += len(s)
	}
	return n
}
