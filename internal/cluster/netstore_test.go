package cluster_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/clade-sandbox/clade/internal/snapstore"
	"github.com/clade-sandbox/clade/internal/snapstore/weedtest"
	"github.com/clade-sandbox/clade/internal/testenv"
)

// storeCluster starts n daemons as StartNetCluster does, sharing a real
// S3 store (SeaweedFS on the test's bridge) in bucket, made before the
// daemons start (a daemon refuses a store without its bucket). It returns
// the cluster and the store's config (credentials, no key).
func storeCluster(t *testing.T, n int, bucket string, extra []string, perNode func(i int) []string) (*testenv.NetCluster, snapstore.S3Config) {
	t.Helper()
	var cfg snapstore.S3Config
	creds := filepath.Join(testenv.TempDir(t), "creds")
	c := testenv.StartNetClusterWith(t, n, extra, perNode, func(br netip.Addr) []string {
		srv := weedtest.StartAt(t, br.String())
		cfg = srv.Config(bucket)
		st, err := snapstore.NewS3(t.Context(), cfg)
		if err == nil {
			err = st.Probe(t.Context())
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(creds, fmt.Appendf(nil, "AWS_ACCESS_KEY_ID=%s\nAWS_SECRET_ACCESS_KEY=%s\n", cfg.AccessKey, cfg.SecretKey), 0o600); err != nil {
			t.Fatal(err)
		}
		return []string{"--object-store", "s3://" + bucket + "?endpoint=" + srv.Endpoint, "--object-store-credentials", creds}
	})
	return c, cfg
}
