package e2b

import (
	"context"
	"net/http"
	"strings"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/front/e2b/envdpb/filesystem"
	"github.com/clade-sandbox/clade/internal/service"
)

// File metadata (envd 0.6.2): an upload's X-Metadata-KEY headers are kept
// on each file written as extended attributes user.e2b.KEY (KEY lower
// case), replacing what the file had, and returned in its entries
// (upload answers, Stat, ListDir, MakeDir, Move, watch entries).
const (
	metadataHeader = "X-Metadata-"
	metadataXattr  = "user.e2b."
	// maxMetadataKey is envd's bound of a key: the VFS's 255-byte xattr
	// name less the prefix.
	maxMetadataKey = 255 - len(metadataXattr)
	// maxMetadata is envd's bound of a file's metadata: keys with the
	// prefix, and values.
	maxMetadata = 4096
)

// uploadMetadata reads an upload's metadata headers: nil for none, a 400
// for a key or value envd refuses. A header sent twice counts once, with
// its first value.
func uploadMetadata(h http.Header) (map[string]string, error) {
	var md map[string]string
	total := 0
	for name, vals := range h {
		if len(name) <= len(metadataHeader) || !strings.EqualFold(name[:len(metadataHeader)], metadataHeader) {
			continue
		}
		key := strings.ToLower(name[len(metadataHeader):])
		if _, dup := md[key]; dup || len(vals) == 0 {
			continue
		}
		if !validMetadataKey(key) {
			return nil, errdefs.New(errdefs.InvalidArgument, "metadata key %.64q: give at most %d bytes of printable US-ASCII", key, maxMetadataKey)
		}
		if !printable(vals[0]) {
			return nil, errdefs.New(errdefs.InvalidArgument, "metadata value of %q: give printable US-ASCII", key)
		}
		total += len(metadataXattr) + len(key) + len(vals[0])
		if total > maxMetadata {
			return nil, errdefs.New(errdefs.InvalidArgument, "metadata of %d bytes or more: a file holds at most %d (keys with the %q prefix, and values)", total, maxMetadata, metadataXattr)
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = vals[0]
	}
	return md, nil
}

func validMetadataKey(k string) bool {
	return k != "" && len(k) <= maxMetadataKey && printable(k)
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// setMetadata keeps md on the file p of sandbox id. A file written by an
// upload is a new one, so without metadata there is nothing to clear.
func (s *Server) setMetadata(ctx context.Context, id, p string, md map[string]string) error {
	if len(md) == 0 {
		return nil
	}
	return s.svc.SetXattrs(ctx, id, service.Wake, p, metadataXattr, md)
}

// fillMetadata sets the metadata of each entry from its attributes. A
// sandbox whose agent keeps none (an older clade's, or a sandbox of
// another node) has none to show; what the sandbox sends that envd would
// not have stored is left out.
func (s *Server) fillMetadata(ctx context.Context, id string, list []*filesystem.EntryInfo) error {
	if len(list) == 0 {
		return nil
	}
	paths := make([]string, len(list))
	for i, e := range list {
		paths[i] = e.Path
	}
	mds, err := s.svc.Xattrs(ctx, id, service.Wake, metadataXattr, paths)
	if err != nil {
		if errdefs.ClassOf(err) == errdefs.InvalidArgument {
			return nil
		}
		return err
	}
	for i, md := range mds {
		for k, v := range md {
			if validMetadataKey(k) && printable(v) {
				if list[i].Metadata == nil {
					list[i].Metadata = map[string]string{}
				}
				list[i].Metadata[k] = v
			}
		}
	}
	return nil
}
