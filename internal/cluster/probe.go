package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/sdk"
)

// The merged streams' probes of the other nodes are the daemon's, not
// each stream's: one prober (probeLoop) reads the live nodes and probes
// each other node's API once per poll while a merged stream is open and
// for proberLinger after the last one closed, and keeps its last answer
// (Across.silent). A stream ends the part of a node the prober found
// silent, and does not wait for such a node when it opens: a stream that
// opens after another closed, or while another runs, knows a silent node
// at once, and a silent node costs one probe per second per daemon, not
// per stream.

// proberLinger is how long the prober goes on after the last merged
// stream closed: a client that reconnects (the SDK resuming, `clade
// events` run again) finds what it learnt still fresh.
const proberLinger = time.Minute

// use counts a merged stream open (until its done), starting the prober
// if it is not running.
func (a *Across) use() (done func()) {
	a.mu.Lock()
	a.streams++
	if !a.probing {
		a.probing = true
		go a.probeLoop()
	}
	a.mu.Unlock()
	return func() {
		a.mu.Lock()
		a.streams--
		a.lastUse = time.Now()
		a.mu.Unlock()
	}
}

// probeLoop probes every other live node once per poll (a node whose
// probe is still under way is not probed twice) until no merged stream
// has been open for proberLinger, or the node leaves the cluster.
func (a *Across) probeLoop() {
	t := time.NewTicker(a.poll)
	defer t.Stop()
	inflight := map[string]bool{}
	done := make(chan string)
	for {
		select {
		case <-a.s.c.stop:
			a.stopProbing()
			return
		case name := <-done:
			delete(inflight, name)
			continue
		case <-t.C:
		}
		a.mu.Lock()
		idle := a.streams == 0 && time.Since(a.lastUse) > proberLinger
		if idle && len(inflight) == 0 {
			a.probing = false
			a.mu.Unlock()
			return
		}
		a.mu.Unlock()
		if idle {
			continue // the probes under way end first
		}
		ctx, cancel := context.WithTimeout(context.Background(), a.wait)
		nodes, ok := a.liveNodes(ctx)
		cancel()
		if !ok {
			continue // etcd out of reach: the last answers stand
		}
		a.forgetGone(nodes)
		for _, n := range sortedNodes(nodes) {
			if n.Name == a.self() || inflight[n.Name] {
				continue
			}
			inflight[n.Name] = true
			go func() {
				_ = a.answers(context.Background(), n)
				select {
				case done <- n.Name:
				case <-a.s.c.stop: // the loop ended with the node
				}
			}()
		}
	}
}

// stopProbing marks the prober stopped (the node leaves).
func (a *Across) stopProbing() {
	a.mu.Lock()
	a.probing = false
	a.mu.Unlock()
}

// forgetGone drops what the prober knew of nodes that are not live.
func (a *Across) forgetGone(nodes map[string]api.Node) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for name := range a.silent {
		if _, ok := nodes[name]; !ok {
			delete(a.silent, name)
		}
	}
}

// answers probes whether node n's API answers within the wait: any
// answer counts (an error status too), only silence or a refusal does
// not. It records the answer for every stream (silent, or forgotten).
func (a *Across) answers(ctx context.Context, n api.Node) error {
	c, err := a.client(n)
	if err != nil {
		return err
	}
	t0 := time.Now()
	pctx, cancel := context.WithTimeout(ctx, a.wait)
	defer cancel()
	_, err = c.Health(pctx)
	var se *sdk.Error
	switch {
	case err == nil || errors.As(err, &se):
		a.answered(n.Name)
		return nil
	case ctx.Err() != nil:
		return err // not the node's doing
	case pctx.Err() != nil:
		err = errNoAnswer{a.wait}
	}
	a.noteSilent(n, t0, err)
	return err
}

// noteSilent records that node n did not answer a call made at t0 (err
// why, the SDK's words: logged): streams that open meanwhile do not wait
// for it, and open ones end its part unless an event of it came after t0.
func (a *Across) noteSilent(n api.Node, t0 time.Time, err error) {
	why := silentWords(n, err)
	a.mu.Lock()
	s, was := a.silent[n.Name]
	if !was || t0.After(s.at) {
		a.silent[n.Name] = silence{at: t0, why: why}
	}
	a.mu.Unlock()
	if !was {
		a.s.c.cfg.Log.Info("cluster: a node's API does not answer", "node", n.Name, "addr", n.Addr, "err", err)
	}
}

// errNoAnswer is a call a node left unanswered for the wait.
type errNoAnswer struct{ wait time.Duration }

func (e errNoAnswer) Error() string { return fmt.Sprintf("no answer within %s", e.wait) }

// silentWords says that node n does not answer, though its lease lives.
func silentWords(n api.Node, err error) string {
	return fmt.Sprintf("%s though its lease is live: its events are held until it answers again", notAnswering(n, err))
}

// notAnswering says, in the cluster's words, that node n does not answer
// and how: its name, its address, and what its address did (nothing
// within the wait, refused, cut the connection). err is the transport's
// or the SDK's error, whose words are for a CLI user with a daemon of
// their own ("is `clade daemon` running?"): the caller logs it.
func notAnswering(n api.Node, err error) string {
	at := ""
	if n.Addr != "" {
		at = " at " + n.Addr
	}
	return fmt.Sprintf("node %s%s does not answer (%s)", n.Name, at, howNot(err))
}

// howNot is what a node's address did to a call that failed with err.
func howNot(err error) string {
	var na errNoAnswer
	var ne net.Error
	switch {
	case errors.As(err, &na):
		return na.Error()
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused: nothing listens there"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "its address is unreachable"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "it cut the connection"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "no answer in time"
	default:
		return "its API cannot be reached"
	}
}

// isTransport reports whether err is a call that got no answer of the
// node (refused, cut, silent), rather than the node's own error answer or
// a check of what it sent.
func isTransport(err error) bool {
	var ce *sdk.ConnectError
	var ne net.Error
	var na errNoAnswer
	return errors.As(err, &ce) || errors.As(err, &ne) || errors.As(err, &na) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, context.DeadlineExceeded)
}
