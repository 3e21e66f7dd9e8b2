package e2b

import (
	"compress/gzip"
	"fmt"
	"io"

	"connectrpc.com/connect"
)

// maxMessage is the most one envd (Connect) request message may be, as
// sent and as decoded: a path, a command line, a chunk of stdin. Without
// it a 510 KB gzip-encoded Stat took the daemon to 1.8 GB.
const maxMessage = 8 << 20

// connectLimits bound what the envd handlers read. Connect's own gzip
// decoder, stopped at the read limit, would still inflate the rest of a
// message to count it: this one fails at once.
var connectLimits = []connect.HandlerOption{
	connect.WithReadMaxBytes(maxMessage),
	connect.WithCompression("gzip",
		func() connect.Decompressor { return &cappedGunzip{} },
		func() connect.Compressor { return gzip.NewWriter(nil) }),
}

// cappedGunzip decodes gzip and fails past maxMessage+1 bytes (the byte
// by which Connect tells a message is over its limit).
type cappedGunzip struct {
	zr   gzip.Reader
	left int64
}

func (d *cappedGunzip) Read(p []byte) (int, error) {
	if d.left <= 0 {
		return 0, fmt.Errorf("a message decodes to more than %d bytes", maxMessage)
	}
	if int64(len(p)) > d.left {
		p = p[:d.left]
	}
	n, err := d.zr.Read(p)
	d.left -= int64(n)
	return n, err
}

func (d *cappedGunzip) Reset(r io.Reader) error {
	d.left = maxMessage + 1
	return d.zr.Reset(r)
}

func (d *cappedGunzip) Close() error { return d.zr.Close() }
