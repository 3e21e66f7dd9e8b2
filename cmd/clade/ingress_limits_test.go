package main

import (
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/ingress"
)

// The ingress limit flags' 0 turns a limit off; the config's 0 would take
// its default, so the flags map 0 to "off" (negative), keep other values,
// and refuse negative ones.
func TestIngressLimits(t *testing.T) {
	c := ingress.Config{ResponseHeaderTimeout: 0, BodyIdleTimeout: 30 * time.Second, SendTimeout: 0, MaxConnsPerSandbox: 0, MaxClientConns: 0, MaxClientConnsPerIP: 7}
	if err := ingressLimits(&c); err != nil {
		t.Fatal(err)
	}
	want := ingress.Config{ResponseHeaderTimeout: -1, BodyIdleTimeout: 30 * time.Second, SendTimeout: -1, MaxConnsPerSandbox: -1, MaxClientConns: -1, MaxClientConnsPerIP: 7}
	if c != want {
		t.Fatalf("got %+v, want %+v", c, want)
	}
	for _, bad := range []ingress.Config{{ResponseHeaderTimeout: -time.Second}, {MaxConnsPerSandbox: -2}, {SendTimeout: -1}, {MaxClientConns: -1}, {MaxClientConnsPerIP: -3}} {
		if err := ingressLimits(&bad); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}
