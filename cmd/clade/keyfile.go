package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
)

// maxKeyFile bounds what a --key-file may hold: a key is 64 hex digits
// and a newline; a longer file is the wrong file.
const maxKeyFile = 4 << 10

// readKeyFile reads a volume key from a regular file of at most
// maxKeyFile bytes and trims it. A FIFO, a device (/dev/zero), a
// directory or an oversized file is refused, never read until it ends:
// it is opened without blocking and checked before a byte is read.
func readKeyFile(name string) (string, error) {
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("--key-file %s is not a regular file (%s): give the file that holds the key, hex of 32 bytes", name, kind(fi.Mode()))
	}
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return "", fmt.Errorf("--key-file %s: %w", name, err)
	}
	if len(b) > maxKeyFile {
		return "", fmt.Errorf("--key-file %s is over %d bytes: it must hold only the key, hex of 32 bytes", name, maxKeyFile)
	}
	key := strings.TrimSpace(string(b))
	if key == "" {
		return "", fmt.Errorf("--key-file %s is empty: it must hold the volume's key, hex of 32 bytes", name)
	}
	return key, nil
}

func kind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a FIFO"
	case m&os.ModeDevice != 0:
		return "a device"
	case m&os.ModeSocket != 0:
		return "a socket"
	}
	return m.Type().String()
}
