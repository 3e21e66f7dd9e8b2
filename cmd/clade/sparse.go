package main

import (
	"io"
	"os"
)

// sparseChunk is the unit sparseWriter skips: a run of this many zero
// bytes, aligned in the file, becomes a hole.
const sparseChunk = 64 << 10

// sparseWriter writes to a new file, leaving holes where whole aligned
// chunks are zero: a volume export is mostly the zeros of unwritten
// blocks, which would otherwise take their full size on disk. Close
// sets the file's size (a trailing hole) and closes it.
type sparseWriter struct {
	f   *os.File
	buf []byte
	off int64 // bytes written or skipped so far
}

func newSparseWriter(f *os.File) *sparseWriter {
	return &sparseWriter{f: f, buf: make([]byte, 0, sparseChunk)}
}

func (w *sparseWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := copy(w.buf[len(w.buf):cap(w.buf)], p)
		w.buf = w.buf[:len(w.buf)+k]
		p = p[k:]
		if len(w.buf) == cap(w.buf) {
			if err := w.flush(); err != nil {
				return n - len(p), err
			}
		}
	}
	return n, nil
}

func (w *sparseWriter) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	if zero(w.buf) {
		if _, err := w.f.Seek(int64(len(w.buf)), io.SeekCurrent); err != nil {
			return err
		}
	} else if _, err := w.f.Write(w.buf); err != nil {
		return err
	}
	w.off += int64(len(w.buf))
	w.buf = w.buf[:0]
	return nil
}

// Close flushes what is buffered, gives the file its full size and closes it.
func (w *sparseWriter) Close() error {
	err := w.flush()
	if err == nil {
		err = w.f.Truncate(w.off)
	}
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	return err
}

func zero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
