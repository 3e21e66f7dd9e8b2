package stateimg

import (
	"bytes"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// TestCRCZeros: extending a sum over n zero bytes arithmetically is
// crc32.Update over n zero bytes, for sizes around every power of two.
func TestCRCZeros(t *testing.T) {
	zeros := make([]byte, 1<<21)
	for _, seed := range []uint32{0, 0xdeadbeef, crc32.Checksum([]byte("clade"), castagnoli)} {
		for k := 0; k <= 21; k++ {
			for _, n := range []int{1<<k - 1, 1 << k, 1<<k + 1} {
				if n > len(zeros) || n < 0 {
					continue
				}
				if got, want := crcZeros(seed, int64(n)), crc32.Update(seed, castagnoli, zeros[:n]); got != want {
					t.Fatalf("crcZeros(%08x, %d) = %08x, want %08x", seed, n, got, want)
				}
			}
		}
	}
}

// TestChecksumSparse: a file with holes (leading, inner, trailing) sums as
// its whole content does, and the same content written without holes sums
// the same.
func TestChecksumSparse(t *testing.T) {
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(1, 2))
	const size = 64 << 20
	full := make([]byte, size)
	sparse, err := os.Create(filepath.Join(dir, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if err := sparse.Truncate(size); err != nil {
		t.Fatal(err)
	}
	// Data at odd offsets and lengths, holes between (the first MiB and
	// the last stay holes).
	for off := int64(1 << 20); off < size-(2<<20); off += int64(r.IntN(4<<20)) + 1 {
		n := r.IntN(300<<10) + 1
		b := full[off : off+int64(n)]
		for i := range b {
			b[i] = byte(r.Uint32() | 1)
		}
		if _, err := sparse.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
	sparse.Close()
	if err := os.WriteFile(filepath.Join(dir, "dense"), full, 0o600); err != nil {
		t.Fatal(err)
	}
	want := crc32.Checksum(full, castagnoli)
	for _, name := range []string{"sparse", "dense"} {
		got, err := checksum(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("checksum of the %s file = %08x, want the content's %08x", name, got, want)
		}
	}
	// A hole filled with anything but zeros changes the sum.
	f, _ := os.OpenFile(filepath.Join(dir, "sparse"), os.O_WRONLY, 0)
	_, _ = f.WriteAt([]byte{1}, 10)
	f.Close()
	if got, _ := checksum(filepath.Join(dir, "sparse")); got == want {
		t.Fatal("a byte written into a hole left the checksum as it was")
	}
	// An empty file and an all-hole file.
	for name, b := range map[string][]byte{"empty": nil} {
		_ = os.WriteFile(filepath.Join(dir, name), b, 0o600)
		if got, _ := checksum(filepath.Join(dir, name)); got != crc32.Checksum(b, castagnoli) {
			t.Fatalf("checksum of %s = %08x", name, got)
		}
	}
	hole, _ := os.Create(filepath.Join(dir, "hole"))
	_ = hole.Truncate(5 << 20)
	hole.Close()
	if got, _ := checksum(filepath.Join(dir, "hole")); got != crc32.Checksum(bytes.Repeat([]byte{0}, 5<<20), castagnoli) {
		t.Fatalf("checksum of an all-hole file = %08x", got)
	}
}
