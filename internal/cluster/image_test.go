package cluster

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/clade-sandbox/clade/internal/stateimg"
)

// sealedImage makes a sealed image of a few files (one sparse, mostly
// zeros, as a memory image is) and returns its dir and digest.
func sealedImage(t *testing.T) (string, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "img")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 300<<10)
	_, _ = rand.Read(data)
	if err := os.WriteFile(filepath.Join(dir, "pages.img"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "sub", "mem"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("tail"), 3<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := stateimg.Seal(dir); err != nil {
		t.Fatal(err)
	}
	b, _, err := stateimg.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return dir, "sha256:" + hex.EncodeToString(sum[:])
}

// TestImageStream sends a sealed image over real HTTP: intact, it arrives
// whole and verifies; a peer that flips one byte of a file, sends another
// manifest, cuts the stream short or appends bytes is refused, and the
// receiver keeps nothing of it.
func TestImageStream(t *testing.T) {
	src, digest := sealedImage(t)
	var buf bytes.Buffer
	if err := sendImage(&buf, src); err != nil {
		t.Fatal(err)
	}
	stream := buf.Bytes()
	var answer []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(answer) }))
	defer srv.Close()
	fetch := func(t *testing.T, digest string) (string, error) {
		t.Helper()
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		dir := filepath.Join(t.TempDir(), "got")
		err = receiveImage(resp.Body, digest, dir)
		if err == nil {
			err = stateimg.Verify(dir) // as the import does before a restore
		}
		return dir, err
	}

	answer = stream
	dir, err := fetch(t, digest)
	if err != nil {
		t.Fatalf("intact image: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "sub", "mem")); err != nil || fi.Size() != 3<<20+4 {
		t.Fatalf("sparse file: %v %v", fi, err)
	}

	// One byte of a file's data flipped: the sizes agree, the checksum
	// does not.
	flipped := bytes.Clone(stream)
	flipped[len(flipped)-(3<<20)-100] ^= 0x40 // in pages.img, before sub/mem
	answer = flipped
	if _, err := fetch(t, digest); !errors.Is(err, stateimg.ErrCorrupt) {
		t.Fatalf("a flipped byte: %v, want a corrupt image", err)
	} else {
		t.Logf("flipped byte: %v", err)
	}
	// Another image's manifest (the digest asked for is not its).
	other, _ := sealedImage(t)
	var ob bytes.Buffer
	if err := sendImage(&ob, other); err != nil {
		t.Fatal(err)
	}
	for name, a := range map[string][]byte{
		"another manifest": ob.Bytes(),
		"cut short":        stream[:len(stream)-10],
		"bytes after":      append(bytes.Clone(stream), 'x'),
		"empty":            nil,
		"huge manifest":    {0xff, 0xff, 0xff, 0xff},
	} {
		answer = a
		dir, err := fetch(t, digest)
		if !errors.Is(err, stateimg.ErrCorrupt) {
			t.Fatalf("%s: %v, want a corrupt image", name, err)
		}
		if _, serr := os.Stat(dir); !errors.Is(serr, os.ErrNotExist) {
			t.Fatalf("%s: the refused image's dir is left: %v", name, serr)
		}
	}
}
