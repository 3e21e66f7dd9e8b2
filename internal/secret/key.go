// Package secret keeps sandbox secrets sealed with the host's key and
// injects them into sandboxes; it also owns that key.
//
// A secret's value is sealed with AES-256-GCM under the host key before it
// reaches the store; the additional data binds it to its name and version,
// so a sealed value cannot be moved to another name or rolled back to
// another version unnoticed. Plaintext exists only in the daemon's memory
// while a sandbox starts, in the sandbox (its environment or a file on an
// in-sandbox tmpfs), and in the runsc bundle of a sandbox that takes it in
// its environment (see Hook).
package secret

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// KeySize is the host key's length: AES-256.
const KeySize = 32

// Key is the host key that seals secrets (and, later, state at rest).
type Key struct {
	aead cipher.AEAD
	raw  []byte
	// Source says where the key came from, for messages (never the key).
	Source string
}

// NewKey makes a Key of raw bytes.
func NewKey(raw []byte, source string) (*Key, error) {
	if len(raw) != KeySize {
		return nil, errdefs.New(errdefs.InvalidArgument, "the key from %s has %d bytes: want %d (hex or base64 of 32 random bytes)", source, len(raw), KeySize)
	}
	block, err := aes.NewCipher(raw)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Key{aead: aead, raw: append([]byte(nil), raw...), Source: source}, nil
}

// LoadKey reads the host key: from the environment variable env when it
// is set (hosts that keep the key off the disk; hex or base64), else from
// file, which is created 0600 with a new random key when missing and
// create is true (a data dir that has sealed nothing yet). A file readable
// by others than its owner is refused.
func LoadKey(file, env string, create bool) (*Key, error) {
	if env != "" {
		if v, ok := os.LookupEnv(env); ok {
			raw, err := decodeKey(v)
			if err != nil {
				return nil, fmt.Errorf("$%s: %w", env, err)
			}
			return NewKey(raw, "$"+env)
		}
	}
	b, err := readKeyFile(file)
	if errors.Is(err, os.ErrNotExist) && !create {
		return nil, errdefs.New(errdefs.NotFound, "key file %s is missing, but this data dir holds values sealed with a key: put the key file back (or pass the key in $%s); nothing was changed or deleted", file, env)
	}
	if errors.Is(err, os.ErrNotExist) {
		raw := make([]byte, KeySize)
		if _, err := rand.Read(raw); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(file, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return nil, fmt.Errorf("create key file %s: %w", file, err)
		}
		_, err = f.Write([]byte(hex.EncodeToString(raw) + "\n"))
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, errors.Join(fmt.Errorf("write key file %s: %w", file, err), os.Remove(file))
		}
		return NewKey(raw, file)
	}
	if err != nil {
		return nil, fmt.Errorf("read key file %s: %w", file, err)
	}
	raw, err := decodeKey(string(b))
	if err != nil {
		return nil, fmt.Errorf("key file %s: %w", file, err)
	}
	return NewKey(raw, file)
}

// maxKeyFile bounds a key file: a key is 64 hex digits and a newline; a
// longer file is the wrong file.
const maxKeyFile = 4 << 10

// readKeyFile reads a key file: a regular file of at most maxKeyFile
// bytes, readable by its owner only. A FIFO, a device (/dev/zero), a
// directory or an oversized file is refused before a byte is read (opened
// without blocking), never read until it ends: a daemon's start would
// hang on a FIFO, or fill its memory.
func readKeyFile(file string) ([]byte, error) {
	f, err := os.OpenFile(file, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	switch {
	case !fi.Mode().IsRegular():
		return nil, errdefs.New(errdefs.InvalidArgument, "key file %s is not a regular file (%s): give the file that holds the key, hex or base64 of %d bytes", file, fi.Mode().Type(), KeySize)
	case fi.Mode().Perm()&0o077 != 0:
		return nil, errdefs.New(errdefs.InvalidArgument, "key file %s is readable by others (mode %v): chmod 600 it", file, fi.Mode().Perm())
	case fi.Size() > maxKeyFile:
		return nil, errdefs.New(errdefs.InvalidArgument, "key file %s is over %d bytes (%d): it must hold only the key, hex or base64 of %d bytes", file, maxKeyFile, fi.Size(), KeySize)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err == nil && len(b) > maxKeyFile {
		err = errdefs.New(errdefs.InvalidArgument, "key file %s is over %d bytes: it must hold only the key, hex or base64 of %d bytes", file, maxKeyFile, KeySize)
	}
	return b, err
}

func decodeKey(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	if raw, err := hex.DecodeString(s); err == nil {
		return raw, nil
	}
	if raw, err := base64.StdEncoding.DecodeString(s); err == nil {
		return raw, nil
	}
	return nil, errdefs.New(errdefs.InvalidArgument, "not hex or base64 of %d bytes", KeySize)
}

// Derive returns a 32-byte key for purpose, derived from the host key
// (HKDF-SHA256): one host key, independent keys per use.
func (k *Key) Derive(purpose string) []byte {
	out, err := hkdf.Key(sha256.New, k.raw, nil, purpose, KeySize)
	if err != nil {
		panic(err) // only for lengths HKDF cannot make
	}
	return out
}

// Seal encrypts plaintext bound to ad; the result is nonce || ciphertext.
func (k *Key) Seal(plaintext, ad []byte) []byte {
	nonce := make([]byte, k.aead.NonceSize(), k.aead.NonceSize()+len(plaintext)+k.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return k.aead.Seal(nonce, nonce, plaintext, ad)
}

// Open decrypts what Seal made with the same ad. A wrong key, ad or a
// changed byte is an error that says so, without the contents.
func (k *Key) Open(sealed, ad []byte) ([]byte, error) {
	n := k.aead.NonceSize()
	if len(sealed) < n+k.aead.Overhead() {
		return nil, errors.New("sealed value is truncated")
	}
	out, err := k.aead.Open(nil, sealed[:n], sealed[n:], ad)
	if err != nil {
		return nil, errors.New("sealed value does not open with this key (wrong key, or the value was changed)")
	}
	return out, nil
}
