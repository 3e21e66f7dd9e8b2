package system

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/store"
)

// checkAtRestMode refuses a start whose --encrypt-at-rest differs from how
// the data dir keeps the state its store records. With encryption, sleep
// images, snapshots, volumes and upper layers live in the encrypted view;
// without, beside the store. A daemon started the other way finds none of
// them, and its reconcile would drop the records (a sleeping sandbox
// stopped, its snapshots forgotten) though the files are intact. A data
// dir that records nothing may switch.
func checkAtRestMode(ctx context.Context, st *store.Store, dataDir string, encrypt bool) error {
	_, err := os.Stat(filepath.Join(dataDir, "encrypted", "gocryptfs.conf"))
	encrypted := err == nil
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if encrypted == encrypt {
		return nil
	}
	n, err := recorded(ctx, st)
	if err != nil || n == "" {
		return err
	}
	if encrypted {
		return errdefs.New(errdefs.InvalidArgument, "data dir %s keeps its state encrypted (%s): start the daemon with --encrypt-at-rest; nothing was changed", dataDir, n)
	}
	return errdefs.New(errdefs.InvalidArgument, "data dir %s keeps its state in plaintext (%s), which --encrypt-at-rest would not find: start the daemon without it, or remove them first (or use a new data dir); nothing was changed", dataDir, n)
}

// recorded says what state the store records ("" if none).
func recorded(ctx context.Context, st *store.Store) (string, error) {
	sbs, err := st.ListSandboxes(ctx)
	if err != nil {
		return "", err
	}
	pool, err := st.PoolSandboxes(ctx)
	if err != nil {
		return "", err
	}
	snaps, err := st.ListSnapshots(ctx)
	if err != nil {
		return "", err
	}
	vols, err := st.ListVolumes(ctx)
	if err != nil {
		return "", err
	}
	if len(sbs)+len(pool)+len(snaps)+len(vols) == 0 {
		return "", nil
	}
	return fmt.Sprintf("%d sandbox(es), %d snapshot(s), %d volume(s)", len(sbs)+len(pool), len(snaps), len(vols)), nil
}
