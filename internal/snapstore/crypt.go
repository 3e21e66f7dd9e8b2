package snapstore

import (
	"bufio"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
)

// Objects sent to an object store under --encrypt-at-rest are sealed here,
// in the daemon, before they leave it: the images come from the plain view
// of the at-rest mount (gocryptfs encrypts only what reaches the local
// disk), so without this the object store would get plaintext memory.
//
// Format: magic (8) | salt (16) | chunks. Each chunk is AES-256-GCM of up
// to chunkSize plaintext bytes under a key of its own object (HKDF-SHA256
// of the store key, the salt and the object's name), with the chunk's
// index as nonce and a last-chunk flag in it: chunks cannot be reordered,
// dropped, cut off at the end or moved to another object or image.

const (
	cryptMagic = "clade-s1"
	saltSize   = 16
	chunkSize  = 1 << 20
	tagSize    = 16
	headerSize = len(cryptMagic) + saltSize
)

// sealer encrypts objects under one store key.
type sealer struct {
	key     []byte // 32 bytes
	nameKey []byte
}

func newSealer(key []byte) (*sealer, error) {
	if len(key) != 32 {
		return nil, errors.New("the object store key must be 32 bytes")
	}
	nk, err := hkdf.Key(sha256.New, key, nil, "object names", 32)
	if err != nil {
		return nil, err
	}
	return &sealer{key: key, nameKey: nk}, nil
}

// id names the key without revealing it: "sealed:" and 8 bytes derived
// from it (HKDF), the same on every daemon with the same host key. Nodes
// compare it to tell whether one can open another's objects.
func (s *sealer) id() string {
	b, err := hkdf.Key(sha256.New, s.key, nil, "object store key id", 8)
	if err != nil {
		panic(err) // only for lengths HKDF cannot make
	}
	return "sealed:" + hex.EncodeToString(b)
}

// prefix hides a digest (which names the plaintext manifest) behind a
// keyed hash.
func (s *sealer) prefix(d Digest) string {
	m := hmac.New(sha256.New, s.nameKey)
	m.Write([]byte(d))
	return "e-" + hex.EncodeToString(m.Sum(nil))
}

func (s *sealer) aead(salt []byte, object string) (cipher.AEAD, error) {
	k, err := hkdf.Key(sha256.New, s.key, salt, "object "+object, 32)
	if err != nil {
		return nil, err
	}
	b, err := aes.NewCipher(k)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

// sealedSize is the size of a sealed object of n plaintext bytes.
func sealedSize(n int64) int64 {
	chunks := (n + chunkSize - 1) / chunkSize
	if chunks == 0 {
		chunks = 1 // an empty object still has its last chunk
	}
	return int64(headerSize) + n + chunks*tagSize
}

func nonce(i uint64, last bool) []byte {
	n := make([]byte, 12)
	binary.BigEndian.PutUint64(n, i)
	if last {
		n[11] = 1
	}
	return n
}

// encrypter is an io.Reader of the sealed form of size bytes from r.
type encrypter struct {
	r      io.Reader
	aead   cipher.AEAD
	left   int64 // plaintext bytes not yet sealed; -1: unknown (a stream, r a *bufio.Reader)
	i      uint64
	buf    []byte
	out    []byte
	done   bool
	header []byte
}

// encrypt seals r, of size bytes (-1: a stream of unknown length).
func (s *sealer) encrypt(r io.Reader, size int64, object string) (io.Reader, error) {
	salt := make([]byte, saltSize)
	if _, err := rand.Read(salt); err != nil {
		return nil, err
	}
	a, err := s.aead(salt, object)
	if err != nil {
		return nil, err
	}
	if size < 0 {
		r = bufio.NewReaderSize(r, 64<<10) // chunk reads one byte ahead
	}
	return &encrypter{r: r, aead: a, left: size, buf: make([]byte, chunkSize), header: append([]byte(cryptMagic), salt...)}, nil
}

func (e *encrypter) Read(p []byte) (int, error) {
	if len(e.header) > 0 {
		n := copy(p, e.header)
		e.header = e.header[n:]
		return n, nil
	}
	for len(e.out) == 0 {
		if e.done {
			return 0, io.EOF
		}
		n, last, err := e.chunk()
		if err != nil {
			return 0, err
		}
		e.out = e.aead.Seal(e.out[:0], nonce(e.i, last), e.buf[:n], nil)
		e.i++
		e.done = last
	}
	n := copy(p, e.out)
	e.out = e.out[n:]
	return n, nil
}

// chunk reads the next chunk of plaintext into buf: its length, and
// whether it is the last. With a known length that is where left ends; in
// a stream, where the reader has nothing after it (read one byte ahead).
func (e *encrypter) chunk() (int, bool, error) {
	if e.left < 0 {
		br := e.r.(*bufio.Reader)
		n, err := io.ReadFull(br, e.buf)
		if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, false, err
		}
		if err != nil {
			return n, true, nil
		}
		if _, perr := br.Peek(1); errors.Is(perr, io.EOF) {
			return n, true, nil
		} else if perr != nil {
			return 0, false, perr
		}
		return n, false, nil
	}
	n := min(int64(chunkSize), e.left)
	if _, err := io.ReadFull(e.r, e.buf[:n]); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF // the file shrank under us
		}
		return 0, false, err
	}
	e.left -= n
	return int(n), e.left == 0, nil
}

// errSealed is any failure to open a sealed object: wrong key, tampering,
// truncation.
var errSealed = errors.New("it does not open with this daemon's key (damaged, truncated, or sealed under another key)")

// decrypter is an io.Reader of the plaintext of a sealed object.
type decrypter struct {
	r    io.Reader
	aead cipher.AEAD
	i    uint64
	buf  []byte
	out  []byte
	done bool
}

func (s *sealer) decrypt(r io.Reader, object string) (io.Reader, error) {
	h := make([]byte, headerSize)
	// A read that failed (the store's connection) is not the object's
	// fault: errSealed would have it deleted (a root) or called corrupt.
	if _, err := io.ReadFull(r, h); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, err
	} else if err != nil || string(h[:len(cryptMagic)]) != cryptMagic {
		return nil, errSealed
	}
	a, err := s.aead(h[len(cryptMagic):], object)
	if err != nil {
		return nil, err
	}
	// One byte more than a chunk, to tell the last chunk without a size.
	return &decrypter{r: r, aead: a, buf: make([]byte, 0, chunkSize+tagSize+1)}, nil
}

func (d *decrypter) Read(p []byte) (int, error) {
	for len(d.out) == 0 {
		if d.done {
			return 0, io.EOF
		}
		// buf holds a carried-over byte of the next chunk, if any.
		n, err := io.ReadFull(d.r, d.buf[len(d.buf):chunkSize+tagSize+1])
		d.buf = d.buf[:len(d.buf)+n]
		last := false
		switch {
		case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
			last = true
		case err != nil:
			return 0, err
		}
		chunk := d.buf
		if !last {
			chunk = d.buf[:chunkSize+tagSize]
		}
		pt, oerr := d.aead.Open(nil, nonce(d.i, last), chunk, nil)
		if oerr != nil {
			return 0, errSealed
		}
		d.i++
		d.done = last
		if !last {
			d.buf = append(d.buf[:0], d.buf[chunkSize+tagSize])
		}
		d.out = pt
	}
	n := copy(p, d.out)
	d.out = d.out[n:]
	return n, nil
}
