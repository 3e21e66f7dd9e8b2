package snapstore

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

type resetReader struct{}

func (resetReader) Read([]byte) (int, error) {
	return 0, errors.New("read tcp: connection reset by peer")
}

// TestDecryptReadErrorNotSealed: a sealed object whose read fails (the
// store's connection reset before its header came) is an error of the
// read, not errSealed: errSealed makes a root "bad" (ErrBadRoot), which is
// deleted from the store (Copies.DropBadRoot), and a snapshot's object
// corrupt. A header that is short or not ours is errSealed.
func TestDecryptReadErrorNotSealed(t *testing.T) {
	s, err := newSealer(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.decrypt(resetReader{}, "roots/x/root"); err == nil || errors.Is(err, errSealed) {
		t.Errorf("a read that failed before the header: %v, want the read's error, not errSealed", err)
	}
	er, err := s.encrypt(bytes.NewReader([]byte("hello")), 5, "roots/x/root")
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := io.ReadAll(er)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.decrypt(bytes.NewReader(sealed[:3]), "roots/x/root"); !errors.Is(err, errSealed) {
		t.Errorf("a header cut short: %v, want errSealed", err)
	}
	bad := append([]byte("XXXXXXXX"), sealed[8:]...)
	if _, err := s.decrypt(bytes.NewReader(bad), "roots/x/root"); !errors.Is(err, errSealed) {
		t.Errorf("a header not ours: %v, want errSealed", err)
	}
	r, err := s.decrypt(bytes.NewReader(sealed), "roots/x/root")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(r); err != nil || string(b) != "hello" {
		t.Errorf("a good object: %q %v", b, err)
	}
}
