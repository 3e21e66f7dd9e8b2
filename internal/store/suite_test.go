package store_test

import (
	"path/filepath"
	"testing"

	"github.com/clade-sandbox/clade/internal/store"
	"github.com/clade-sandbox/clade/internal/store/storetest"
)

// TestSuite: the SQLite store passes the suite every store passes.
func TestSuite(t *testing.T) {
	storetest.Run(t, func(t *testing.T, node string) store.All {
		st, err := store.OpenConfig(t.Context(), filepath.Join(t.TempDir(), "clade.db"), store.Config{Node: node})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	})
}
