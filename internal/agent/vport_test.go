package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/agent/wire"
)

// chunkReader returns its chunks one per Read, then its end error.
type chunkReader struct {
	chunks [][]byte
	end    error
	reads  int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	r.reads++
	if len(r.chunks) == 0 {
		return 0, r.end
	}
	n := copy(p, r.chunks[0])
	r.chunks = r.chunks[1:]
	return n, nil
}

// A nudge ends the wait after a quiesce wherever it falls in what is read:
// behind the old host's last frames and cut across reads.
func TestDrainEndsAtANudge(t *testing.T) {
	nudge := wire.Nudge()
	old := wire.AppendHeader(nil, wire.Window, 7, 5)
	old = append(old, 1, 0, 0, 0, 9)
	stream := append(bytes.Clone(old), nudge...)
	for cut := 1; cut < len(stream); cut++ {
		// A reader that would block for ever after the nudge: it fails
		// the test if the drain reads past it.
		r := &chunkReader{chunks: [][]byte{stream[:cut], stream[cut:]}, end: errors.New("read past the nudge")}
		drainUntilNudge(context.Background(), r)
		if r.reads != 2 {
			t.Fatalf("cut at %d: %d reads, want 2 (the drain must stop at the nudge)", cut, r.reads)
		}
	}
}

// Without a nudge the drain ends at EOF (the old host hung up) or the
// deadline's error, having dropped everything read.
func TestDrainEndsAtEOFWithoutANudge(t *testing.T) {
	nudge := wire.Nudge()
	almost := nudge[:len(nudge)-1]
	r := &chunkReader{chunks: [][]byte{almost, []byte("x"), bytes.Repeat([]byte{0}, 5000)}, end: io.EOF}
	done := make(chan struct{})
	go func() { drainUntilNudge(context.Background(), r); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("drain did not end at EOF")
	}
	if r.reads != 4 {
		t.Fatalf("%d reads, want 4 (all chunks, then EOF)", r.reads)
	}
}
