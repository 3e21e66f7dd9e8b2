package cluster

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"testing"
	"testing/iotest"

	"github.com/clade-sandbox/clade/internal/image"
)

// TestSumReader: a root stream from the store passes whole when its
// SHA-256 is the one recorded; otherwise the reader fails with a bad root
// stream before it gives the stream's last bytes (where the stream's own
// digest is), read in small pieces or large; a read error passes on.
func TestSumReader(t *testing.T) {
	stream := make([]byte, 300<<10+17)
	_, _ = rand.Read(stream)
	good := sha256.Sum256(stream)
	bad := good
	bad[0] ^= 1
	for _, small := range []bool{false, true} {
		read := func(want []byte) ([]byte, error) {
			var r io.Reader = newSumReader(io.NopCloser(bytes.NewReader(stream)), want)
			if small {
				r = iotest.OneByteReader(r)
			}
			return io.ReadAll(r)
		}
		got, err := read(good[:])
		if err != nil || !bytes.Equal(got, stream) {
			t.Fatalf("small reads %v: the recorded stream read back %d bytes of %d, %v", small, len(got), len(stream), err)
		}
		got, err = read(bad[:])
		if !errors.Is(err, image.ErrRootStream) {
			t.Fatalf("small reads %v: a stream that is not the one recorded: %v, want a bad root stream", small, err)
		}
		if len(got) > len(stream)-sumHold || !bytes.Equal(got, stream[:len(got)]) {
			t.Fatalf("small reads %v: %d bytes of %d given before the refusal (want at most %d)", small, len(got), len(stream), len(stream)-sumHold)
		}
	}
	_, err := io.ReadAll(newSumReader(io.NopCloser(iotest.TimeoutReader(bytes.NewReader(stream))), good[:]))
	if !errors.Is(err, iotest.ErrTimeout) {
		t.Fatalf("a read error: %v", err)
	}
}
