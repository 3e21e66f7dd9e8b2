package httpapi

import (
	"errors"
	"io"
	"testing"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// zeros is an endless body.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// TestFloorReader: an upload written to the data dir is stopped with the
// floor's error soon after the floor says no (it was read to its end, an
// endless one filling the disk), and a floor that never says no reads it
// all.
func TestFloorReader(t *testing.T) {
	full := errdefs.New(errdefs.Unavailable, "the disk is at its floor")
	for _, tc := range []struct {
		name    string
		body    io.Reader
		okCalls int // checks that pass; -1: all
		want    int64
		wantErr error
	}{
		{"floor never reached", io.LimitReader(zeros{}, 100<<20), -1, 100 << 20, nil},
		{"floor at the start", zeros{}, 0, 0, full},
		{"floor after 3 checks", zeros{}, 3, 3 * floorEvery, full},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			fr := &floorReader{r: tc.body, check: func() error {
				calls++
				if tc.okCalls >= 0 && calls > tc.okCalls {
					return full
				}
				return nil
			}}
			n, err := io.CopyBuffer(io.Discard, fr, make([]byte, 256<<10))
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("copy: %v, want %v", err, tc.wantErr)
			}
			if n != tc.want {
				t.Fatalf("read %d bytes, want %d", n, tc.want)
			}
		})
	}
}
