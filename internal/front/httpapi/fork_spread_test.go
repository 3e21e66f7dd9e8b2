package httpapi_test

import (
	"strings"
	"testing"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// TestForkSpreadOutsideCluster: a daemon outside a cluster refuses a fork
// that asks for the spread with a 400 that says why, and serves no
// internal routes.
func TestForkSpreadOutsideCluster(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	_, err := d.Client.Fork(t.Context(), "anything", 2, sdk.Spread())
	if !sdk.IsInvalidArgument(err) || !strings.Contains(err.Error(), "not in a cluster") {
		t.Fatalf("spread outside a cluster: %v, want invalid_argument", err)
	}
	if _, err := d.Client.Fork(t.Context(), "anything", 2); !sdk.IsNotFound(err) {
		t.Fatalf("a fork of nothing: %v, want not_found", err)
	}
}
