package system

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/internal/secret"
	"github.com/clade-sandbox/clade/internal/snapstore"
)

// objectStorePurpose derives the key of the objects' encryption from the
// host key (secret.Key.Derive).
const objectStorePurpose = "clade snapshot store objects v1"

// openObjectStore opens the snapshot store o.ObjectStore names (nil
// without one): s3://BUCKET[/PREFIX]?endpoint=URL, or a local directory
// (an absolute path or file:///PATH, e.g. a shared mount). Sleep images
// and snapshots are copied there once sealed, and fetched back when their
// local copy is gone. With encryption at rest, objects in S3 are
// encrypted in the daemon before they leave it (AES-256-GCM keyed from
// the host key: a bucket alone reveals neither memory nor digests).
func openObjectStore(ctx context.Context, o Options, key *secret.Key, log *slog.Logger) (*snapstore.Copies, error) {
	if o.ObjectStore == "" {
		return nil, nil
	}
	var st snapstore.Store
	switch u := o.ObjectStore; {
	case strings.HasPrefix(u, "s3://"):
		cfg, err := snapstore.ParseURL(u)
		if err != nil {
			return nil, err
		}
		cfg.AccessKey, cfg.SecretKey = os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY")
		if o.ObjectStoreCredentials != "" {
			if cfg.AccessKey, cfg.SecretKey, err = readCredentials(o.ObjectStoreCredentials); err != nil {
				return nil, err
			}
		}
		if o.EncryptAtRest {
			cfg.Key = key.Derive(objectStorePurpose)
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		s3, err := snapstore.NewS3(cctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("--object-store: %w", err)
		}
		st = s3
	case strings.HasPrefix(u, "file://") || filepath.IsAbs(u):
		dir := strings.TrimPrefix(u, "file://")
		if !filepath.IsAbs(dir) {
			return nil, fmt.Errorf("--object-store %q: a local store is an absolute path (file:///PATH)", u)
		}
		l, err := snapstore.NewLocal(dir)
		if err != nil {
			return nil, fmt.Errorf("--object-store: %w", err)
		}
		l.SetLog(log)
		st = l
	default:
		return nil, fmt.Errorf("--object-store %q: want s3://BUCKET[/PREFIX]?endpoint=http(s)://HOST:PORT or an absolute directory path", u)
	}
	c, err := snapstore.NewCopies(st, filepath.Join(o.DataDir, "objects"), log)
	if err != nil {
		return nil, err
	}
	// How long an image root no stored image names stays in the store
	// (snapstore.DefaultRootGrace; 0: deleted with the last image).
	if g := os.Getenv("CLADE_STORE_ROOT_GRACE"); g != "" {
		d, err := time.ParseDuration(g)
		if err != nil || d < 0 {
			c.Close()
			return nil, fmt.Errorf("CLADE_STORE_ROOT_GRACE=%q: want a duration (e.g. 1h, 0s)", g)
		}
		c.SetRootGrace(d)
	}
	log.Info("snapshot store: sleep images and snapshots are copied to it", "store", redactStore(o.ObjectStore), "encrypted", o.EncryptAtRest && strings.HasPrefix(o.ObjectStore, "s3://"))
	return c, nil
}

// readCredentials reads AWS_ACCESS_KEY_ID=... and AWS_SECRET_ACCESS_KEY=...
// lines (blank lines and # comments skipped).
func readCredentials(path string) (access, secretKey string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", "", fmt.Errorf("--object-store-credentials: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		switch k = strings.TrimSpace(k); {
		case !ok:
			return "", "", fmt.Errorf("--object-store-credentials %s: a line is not KEY=VALUE", path)
		case k == "AWS_ACCESS_KEY_ID":
			access = strings.TrimSpace(v)
		case k == "AWS_SECRET_ACCESS_KEY":
			secretKey = strings.TrimSpace(v)
		default:
			return "", "", fmt.Errorf("--object-store-credentials %s: unknown key %q (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)", path, k)
		}
	}
	if err := sc.Err(); err != nil {
		return "", "", err
	}
	if access == "" || secretKey == "" {
		return "", "", fmt.Errorf("--object-store-credentials %s: needs both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", path)
	}
	return access, secretKey, nil
}

// redactStore drops a URL's query for the log (it holds no secret today,
// but an endpoint with userinfo might).
func redactStore(u string) string {
	if i := strings.IndexAny(u, "?@"); i >= 0 {
		return u[:i] + "?..."
	}
	return u
}
