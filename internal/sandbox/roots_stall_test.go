package sandbox

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/image"
)

// stalledRoot is a root stream from a node that sent nothing and hangs
// (partitioned, or stuck): like an HTTP body, it ends with its context.
type stalledRoot struct{ ctx context.Context }

func (s stalledRoot) Read([]byte) (int, error) { <-s.ctx.Done(); return 0, s.ctx.Err() }
func (s stalledRoot) Close() error             { return nil }

// TestRootForStalledFetch: a fetch of one root that hangs (its node
// stopped answering mid-stream) holds up neither the fetch of another
// root nor a wait for the same one past the waiter's context: an adopt,
// bounded by its timeout, is not stuck behind another's fetch.
func TestRootForStalledFetch(t *testing.T) {
	var aImg, bImg image.Image
	a, _, _ := shipNode(t, "a", &aImg, Config{})
	b, _, _ := shipNode(t, "b", &bImg, Config{})
	c, _, _ := shipNode(t, "c", nil, Config{})
	calls := 0

	stallCtx, unstall := context.WithCancel(t.Context())
	defer unstall()
	fetching := make(chan struct{})
	stalled := make(chan error, 1)
	go func() {
		_, _, err := c.images.rootFor(stallCtx, testImage, RootID(aImg), func(ctx context.Context, id string) (io.ReadCloser, error) {
			close(fetching)
			return stalledRoot{stallCtx}, nil
		})
		stalled <- err
	}()
	<-fetching

	call := func(what, id string, fetch RootFetch, timeout time.Duration) (image.Image, func(), error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), timeout)
		defer cancel()
		type res struct {
			img     image.Image
			release func()
			err     error
		}
		ch := make(chan res, 1)
		go func() {
			img, release, err := c.images.rootFor(ctx, testImage, id, fetch)
			ch <- res{img, release, err}
		}()
		select {
		case r := <-ch:
			return r.img, r.release, r.err
		case <-time.After(timeout + 20*time.Second):
			t.Fatalf("%s: rootFor still waits %s after its context ended", what, 20*time.Second)
			return image.Image{}, nil, nil
		}
	}
	// Another root: fetched at once.
	img, release, err := call("another root", RootID(bImg), rootFrom(NewPorter(b), &calls), 30*time.Second)
	if err != nil {
		t.Fatalf("another root, while a fetch stalls: %v", err)
	}
	release()
	if RootID(img) != RootID(bImg) {
		t.Fatalf("got root %s, want %s", RootID(img), RootID(bImg))
	}
	// The same root: waits for the stalled fetch, within its context.
	if _, _, err = call("the same root", RootID(aImg), rootFrom(NewPorter(a), &calls), 2*time.Second); err == nil {
		t.Fatal("the same root, while its fetch stalls: no error")
	}
	t.Logf("the same root's wait: %v", err)
	unstall()
	if err := <-stalled; err == nil {
		t.Fatal("the stalled fetch succeeded")
	}
	// Once the stalled fetch gave up, the root is fetched anew.
	img, release, err = call("the same root again", RootID(aImg), rootFrom(NewPorter(a), &calls), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	release()
	if RootID(img) != RootID(aImg) {
		t.Fatalf("got root %s, want %s", RootID(img), RootID(aImg))
	}
}
