package httpapi

import (
	"context"
	"net"
	"net/http"

	"golang.org/x/sys/unix"
)

// connKey keys a request's client connection in its context (ConnContext).
type connKey struct{}

// ConnContext is an http.Server's ConnContext for the API's listeners: it
// lets the handlers tell a client that went away from one that only shut
// down its sending side (see peerContext).
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// peerContext returns the context r's handler should run under. Go's
// server cancels a request's context at the first EOF it reads from the
// client, which a client that only shut down its sending side once the
// request was written (socat, `nc -N`, HTTP/1.0-style clients) sends as
// well as one that is gone: that cancel made such a client's create fail
// with "context canceled", or remove the sandbox it was about to answer
// (clientGone). On a unix socket the two differ (a peer that closed shows
// a hang-up; one that shut down its writes does not): the returned
// context is cancelled only for the first. A client that shuts down its
// writes and closes later is not seen to go; TCP cannot tell the two
// apart, so there r's own context is kept. stop must be called once the
// handler is done.
func peerContext(r *http.Request) (ctx context.Context, stop func()) {
	c, ok := r.Context().Value(connKey{}).(*net.UnixConn)
	if !ok {
		return r.Context(), func() {}
	}
	parent := r.Context()
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(parent))
	unwatch := context.AfterFunc(parent, func() {
		if peerHungUp(c) {
			cancel(context.Cause(parent))
		}
	})
	return ctx, func() {
		unwatch()
		cancel(nil)
	}
}

// peerHungUp reports whether c's peer closed it (or c is unusable), not
// merely shut down its writes.
func peerHungUp(c *net.UnixConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return true
	}
	gone := true
	if cerr := rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		if _, err := unix.Poll(fds, 0); err == nil {
			gone = fds[0].Revents&(unix.POLLHUP|unix.POLLERR) != 0
		}
	}); cerr != nil {
		return true
	}
	return gone
}
