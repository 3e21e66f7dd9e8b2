package remote_test

import (
	"testing"

	"github.com/clade-sandbox/clade/internal/service/remote"
	"github.com/clade-sandbox/clade/internal/service/servicetest"
	"github.com/clade-sandbox/clade/internal/testenv"
)

// TestConformance runs the service suite over the SDK against a real
// daemon (runsc): the remote implementation, and through the daemon's API
// the local one on gVisor.
func TestConformance(t *testing.T) {
	d := testenv.StartDaemon(t)
	svc := remote.New(d.Client, "test-node")
	servicetest.Run(t, func(t *testing.T) servicetest.Env {
		return servicetest.Env{Service: svc, Processes: true}
	})
}
