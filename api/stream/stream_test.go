package stream

import (
	"bytes"
	"errors"
	"io"
	"syscall"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf, nil)
	frames := []Frame{{Stdout, []byte("out")}, {Stderr, nil}, {Type(200), []byte("future")}, {Exit, []byte(`{"code":0}`)}}
	for _, f := range frames {
		if err := w.Write(f.Type, f.Payload); err != nil {
			t.Fatal(err)
		}
	}
	r := NewReader(&buf)
	for i, want := range frames {
		got, err := r.Read()
		if err != nil || got.Type != want.Type || !bytes.Equal(got.Payload, want.Payload) {
			t.Fatalf("frame %d: %+v %v, want %+v", i, got, err, want)
		}
	}
	if _, err := r.Read(); err != io.EOF {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
}

func TestReaderErrors(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"truncated header", []byte{4, 0, 0}, io.ErrUnexpectedEOF},
		{"truncated payload", AppendFrame(nil, Stdout, []byte("abc"))[:11], io.ErrUnexpectedEOF},
		{"oversize", []byte{4, 0, 0, 0, 0, 0x01, 0x00, 0x00, 0x01}, ErrFrame},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewReader(bytes.NewReader(tc.in)).Read(); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestSignal(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGKILL, 64} {
		if got, ok := ParseSignal(SignalPayload(sig)); !ok || got != sig {
			t.Errorf("%v: round trip gave %v %v", sig, got, ok)
		}
	}
	for _, p := range [][]byte{nil, {0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 65}, {1, 0, 0, 0, 0}} {
		if _, ok := ParseSignal(p); ok {
			t.Errorf("ParseSignal(%v) accepted", p)
		}
	}
}

// FuzzReader: any input decodes to frames or an error, never a panic, and
// no frame is larger than MaxPayload.
func FuzzReader(f *testing.F) {
	f.Add(AppendFrame(AppendFrame(nil, Stdout, []byte("hi")), Exit, []byte(`{"code":1}`)))
	f.Add([]byte{255, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{4, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := NewReader(bytes.NewReader(in))
		for {
			fr, err := r.Read()
			if err != nil {
				return
			}
			if len(fr.Payload) > MaxPayload {
				t.Fatalf("payload of %d bytes", len(fr.Payload))
			}
			if fr.Type == Resize {
				if r, c, ok := ParseResize(fr.Payload); ok && (r == 0 || c == 0) {
					t.Fatalf("ParseResize accepted %dx%d", r, c)
				}
			}
			if fr.Type == Signal {
				ParseSignal(fr.Payload)
			}
		}
	})
}

func TestResize(t *testing.T) {
	for _, sz := range [][2]uint16{{24, 80}, {1, 1}, {65535, 65535}, {50, 132}} {
		if r, c, ok := ParseResize(ResizePayload(sz[0], sz[1])); !ok || r != sz[0] || c != sz[1] {
			t.Errorf("ParseResize(ResizePayload(%d, %d)) = %d, %d, %v", sz[0], sz[1], r, c, ok)
		}
	}
	for _, p := range [][]byte{nil, {0, 24, 0}, {0, 24, 0, 80, 0}, ResizePayload(0, 80), ResizePayload(24, 0)} {
		if _, _, ok := ParseResize(p); ok {
			t.Errorf("ParseResize(%v) accepted", p)
		}
	}
}
