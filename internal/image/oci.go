package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/tarx"
)

// Config is the part of an OCI image config that says how the image's
// processes run.
type Config struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
}

// Progress reports a pull or import as it goes. Bytes are layer blob bytes
// (compressed, as stored); BytesTotal is 0 when the source does not say.
type Progress struct {
	Layer       string // digest of the layer being fetched or applied, if known yet
	LayersDone  int
	LayersTotal int
	BytesDone   int64
	BytesTotal  int64
	Cached      int // layers found in the store instead of downloaded
}

// PullOptions tune Pull.
type PullOptions struct {
	Name string // image name; DefaultName(ref) if empty
	// Current is the image now called Name, if any: when it holds the
	// manifest the registry serves, Pull downloads nothing and returns it.
	Current  Image
	Platform string // os/arch[/variant] picked from a multi-platform image; linux/amd64 if empty
	Progress func(Progress)
	Insecure bool // allow plain HTTP to the registry
}

// ImportOptions tune Import.
type ImportOptions struct {
	Name string // image name; derived from the archive's tag or file name if empty
	// Source is what the user gave (a file name), recorded as the image's
	// source and used for names and messages instead of the path Import
	// reads, which may be a temporary upload.
	Source   string
	Progress func(Progress)
}

const (
	defaultPlatform = "linux/amd64"
	progressEvery   = 100 * time.Millisecond
)

// Pull fetches the image ref (any OCI or Docker registry; credentials from
// the Docker config, $DOCKER_CONFIG or ~/.docker/config.json) and installs it
// as a new root named opts.Name, unless opts.Current already holds the same
// manifest: then Pull downloads nothing and returns it. Layers already in the
// store are not downloaded again. A failed or cancelled pull leaves no trace
// but blobs it finished (and, with OnRoot, a recorded root).
//
// Errors: InvalidArgument for a bad ref, name or platform, an image that is
// not a container image, a hostile layer, or a registry refusing our
// credentials; NotFound when the registry has no such image or platform;
// Unavailable when the registry cannot be reached or is overloaded.
func (s *Store) Pull(ctx context.Context, ref string, opts PullOptions) (Image, error) {
	var nopts []name.Option
	if opts.Insecure {
		nopts = append(nopts, name.Insecure)
	}
	if err := checkRef(ref); err != nil {
		return Image{}, err
	}
	r, err := name.ParseReference(ref, nopts...)
	if err != nil {
		return Image{}, errdefs.New(errdefs.InvalidArgument, "bad image reference %q: %v", ref, err)
	}
	if opts.Name == "" {
		opts.Name = DefaultName(ref)
	}
	if err := checkNewName(opts.Name); err != nil {
		return Image{}, err
	}
	if opts.Platform == "" {
		opts.Platform = defaultPlatform
	}
	plat, err := v1.ParsePlatform(opts.Platform)
	if err != nil || plat.OS == "" || plat.Architecture == "" {
		return Image{}, errdefs.New(errdefs.InvalidArgument, "bad platform %q: want os/arch[/variant], e.g. linux/arm64", opts.Platform)
	}

	rimg, err := remote.Image(r, remote.WithContext(ctx), remote.WithPlatform(*plat),
		remote.WithAuthFromKeychain(authn.DefaultKeychain))
	if err != nil {
		return Image{}, registryError(ctx, r, plat, err)
	}
	digest, err := rimg.Digest()
	if err != nil {
		return Image{}, err
	}
	m, err := rimg.Manifest()
	if err != nil {
		return Image{}, registryError(ctx, r, plat, err)
	}
	if cur := opts.Current; cur.Name == opts.Name && cur.ManifestDigest == digest.String() {
		if opts.Progress != nil {
			p := Progress{LayersDone: len(m.Layers), LayersTotal: len(m.Layers), Cached: len(m.Layers)}
			for _, l := range m.Layers {
				p.BytesTotal += l.Size
			}
			p.BytesDone = p.BytesTotal
			opts.Progress(p)
		}
		return cur, nil
	}
	if !m.Config.MediaType.IsConfig() {
		return Image{}, errdefs.New(errdefs.InvalidArgument, "%s is not a container image (config type %s)", ref, m.Config.MediaType)
	}
	cfg, err := rimg.ConfigFile()
	if err != nil {
		return Image{}, registryError(ctx, r, plat, err)
	}
	if cfg.OS != "" && !cfg.Platform().Satisfies(*plat) {
		// A single-platform image comes whatever platform we ask for.
		return Image{}, errdefs.New(errdefs.InvalidArgument, "%s is a %s image, not %s", ref, cfg.Platform(), plat)
	}

	layers := make([]layerSource, len(m.Layers))
	for i, d := range m.Layers {
		if !d.MediaType.IsLayer() || !d.MediaType.IsDistributable() {
			return Image{}, errdefs.New(errdefs.InvalidArgument, "%s: layer %s has unsupported type %s", ref, d.Digest, d.MediaType)
		}
		layers[i] = layerSource{digest: d.Digest, size: d.Size, open: func() (io.ReadCloser, error) {
			l, err := rimg.LayerByDigest(d.Digest)
			if err != nil {
				return nil, err
			}
			rc, err := l.Compressed()
			if err != nil {
				return nil, registryError(ctx, r, plat, err)
			}
			return rc, nil
		}}
	}
	img, err := imageFrom(opts.Name, r.Name(), rimg)
	if err != nil {
		return Image{}, err
	}
	img.ManifestDigest = digest.String()
	img.Ref = r.Name()
	out, err := s.install(ctx, img, layers, opts.Progress)
	if err != nil {
		return Image{}, fmt.Errorf("pull %s: %w", ref, err)
	}
	return out, nil
}

// registryError classifies an error from talking to the registry.
func registryError(ctx context.Context, r name.Reference, plat *v1.Platform, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var te *transport.Error
	var ne net.Error
	switch {
	case errors.As(err, &te) && (te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden):
		// Not Unauthenticated: that class means the caller's clade token.
		return errdefs.Wrap(errdefs.InvalidArgument, fmt.Errorf("registry %s refused access to %s (log in with `docker login %s`; credentials come from $DOCKER_CONFIG or ~/.docker/config.json): %w",
			r.Context().RegistryStr(), r.Context().RepositoryStr(), r.Context().RegistryStr(), err))
	case errors.As(err, &te) && te.StatusCode == http.StatusNotFound:
		return errdefs.Wrap(errdefs.NotFound, fmt.Errorf("%s not found: %w", r, err))
	case errors.As(err, &te) && (te.StatusCode == http.StatusTooManyRequests || te.StatusCode >= 500):
		return errdefs.Wrap(errdefs.Unavailable, err)
	case errors.As(err, &ne):
		return errdefs.Wrap(errdefs.Unavailable, fmt.Errorf("registry %s unreachable: %w", r.Context().RegistryStr(), err))
	case strings.Contains(err.Error(), "no child with platform"):
		// go-containerregistry has no typed error for this.
		return errdefs.Wrap(errdefs.NotFound, fmt.Errorf("%s has no %s image: pass another platform: %w", r, plat, err))
	}
	return err
}

// Import installs an image from a file: a `docker save` tarball (its first
// image), an OCI image layout directory, or a tar of one (its first
// manifest; linux/amd64 if that is an index). A missing path is a NotFound
// error; anything else that is not one of those, or a hostile layer, is an
// InvalidArgument error. The name is opts.Name, else derived from the
// image's tag, else from the file name.
func (s *Store) Import(ctx context.Context, p string, opts ImportOptions) (Image, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return Image{}, err
	}
	src := opts.Source
	if src == "" {
		src = abs
	}
	if err := checkSource(src); err != nil {
		return Image{}, err
	}
	fi, err := os.Stat(abs)
	if errors.Is(err, os.ErrNotExist) {
		return Image{}, errdefs.New(errdefs.NotFound, "%s: no such file or directory", src)
	}
	if err != nil {
		return Image{}, err
	}
	if fi.IsDir() {
		return s.importLayout(ctx, abs, src, opts)
	}
	hdrs, err := scanTar(abs)
	if err != nil {
		return Image{}, errdefs.Wrap(errdefs.InvalidArgument, fmt.Errorf("%s is not a tar archive (decompress it first if it is compressed): %w", src, err))
	}
	switch {
	case hdrs["manifest.json"] != nil:
		// Docker 25 and later write both: manifest.json is the sure one.
		return s.importDockerSave(ctx, abs, src, hdrs, opts)
	case hdrs["index.json"] != nil:
		// The layout is read from disk once extracted, and the reader
		// follows symlinks at index.json and above the blobs: blobs/ as a
		// link to a host directory would read the host's blobs (other
		// clients' images, by digest) into this one. A layout needs none.
		for n, h := range hdrs {
			if h.Typeflag == tar.TypeSymlink {
				return Image{}, errdefs.New(errdefs.InvalidArgument, "%s: OCI layout entry %.256q is a symlink: a layout has only files and directories", src, n)
			}
		}
		tmp, err := s.begin("layout")
		if err != nil {
			return Image{}, err
		}
		defer tmp.close()
		f, err := os.Open(abs)
		if err != nil {
			return Image{}, err
		}
		defer f.Close()
		if err := tarx.Extract(tmp.dir, &ctxReader{ctx, f}, tarx.Options{}); err != nil {
			return Image{}, fmt.Errorf("import %s: %w", src, err)
		}
		return s.importLayout(ctx, tmp.dir, src, opts)
	}
	return Image{}, errdefs.New(errdefs.InvalidArgument, "%s is neither a `docker save` tarball nor an OCI image layout", src)
}

// scanTar returns the headers of the tar file at p by clean name.
func scanTar(p string) (map[string]*tar.Header, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	hdrs := map[string]*tar.Header{}
	tr := tar.NewReader(f) // skips file data with Seek
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return hdrs, nil
		}
		if err != nil {
			return nil, err
		}
		hdrs[path.Clean(hdr.Name)] = hdr
	}
}

func (s *Store) importDockerSave(ctx context.Context, p, source string, hdrs map[string]*tar.Header, opts ImportOptions) (Image, error) {
	bad := func(err error) (Image, error) {
		return Image{}, errdefs.Wrap(errdefs.InvalidArgument, fmt.Errorf("import %s: %w", source, err))
	}
	opener := func() (io.ReadCloser, error) { return os.Open(p) }
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		return bad(err)
	}
	if len(m) == 0 {
		return bad(errors.New("manifest.json lists no image"))
	}
	// The first image; tarball selects by tag, so it needs one when there
	// are several.
	d := m[0]
	var tag *name.Tag
	if len(d.RepoTags) > 0 {
		t, err := name.NewTag(d.RepoTags[0])
		if err != nil {
			return bad(err)
		}
		tag = &t
	} else if len(m) > 1 {
		return bad(fmt.Errorf("the tarball holds %d images and the first has no tag", len(m)))
	}
	timg, err := tarball.Image(opener, tag)
	if err != nil {
		return bad(err)
	}
	cfg, err := timg.ConfigFile()
	if err != nil {
		return bad(err)
	}
	if len(cfg.RootFS.DiffIDs) != len(d.Layers) {
		return bad(fmt.Errorf("config lists %d layers, manifest.json %d", len(cfg.RootFS.DiffIDs), len(d.Layers)))
	}
	// Layers are stored as they are in the tarball (docker save's are
	// uncompressed); their digest is known once read.
	layers := make([]layerSource, len(d.Layers))
	for i, lp := range d.Layers {
		hdr, err := tarLink(hdrs, lp)
		if err != nil {
			return bad(err)
		}
		layers[i] = layerSource{size: hdr.Size, open: func() (io.ReadCloser, error) { return tarEntry(p, hdr.Name) }}
	}
	if opts.Name == "" && len(d.RepoTags) > 0 {
		opts.Name = DefaultName(d.RepoTags[0])
	}
	if opts.Name == "" {
		opts.Name = fileName(source)
	}
	if err := checkNewName(opts.Name); err != nil {
		return Image{}, err
	}
	img, err := imageFrom(opts.Name, source, timg)
	if err != nil {
		return bad(err)
	}
	if len(d.RepoTags) > 0 {
		img.Ref = NormalizeRef(d.RepoTags[0])
	}
	out, err := s.install(ctx, img, layers, opts.Progress)
	if err != nil {
		return Image{}, fmt.Errorf("import %s: %w", source, err)
	}
	return out, nil
}

// tarLink returns the header of the file entry name stands for, following
// the links older `docker save` versions use for repeated layers.
func tarLink(hdrs map[string]*tar.Header, name string) (*tar.Header, error) {
	for range 16 {
		hdr := hdrs[path.Clean(name)]
		switch {
		case hdr == nil:
			return nil, fmt.Errorf("layer %s missing from the tarball", name)
		case hdr.Typeflag == tar.TypeReg:
			return hdr, nil
		case hdr.Typeflag == tar.TypeSymlink:
			name = path.Join(path.Dir(hdr.Name), hdr.Linkname)
		case hdr.Typeflag == tar.TypeLink:
			name = hdr.Linkname
		default:
			return nil, fmt.Errorf("layer %s is not a file", name)
		}
	}
	return nil, fmt.Errorf("layer %s: too many links", name)
}

// tarEntry opens the data of the entry called name in the tar file p.
func tarEntry(p, name string) (io.ReadCloser, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err != nil {
			f.Close()
			if err == io.EOF {
				err = fmt.Errorf("%s not found in %s", name, p)
			}
			return nil, err
		}
		if hdr.Name == name {
			return struct {
				io.Reader
				io.Closer
			}{tr, f}, nil
		}
	}
}

func (s *Store) importLayout(ctx context.Context, dir, source string, opts ImportOptions) (Image, error) {
	bad := func(err error) (Image, error) {
		return Image{}, errdefs.Wrap(errdefs.InvalidArgument, fmt.Errorf("import %s: %w", source, err))
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return bad(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return bad(err)
	}
	if len(im.Manifests) == 0 {
		return bad(errors.New("index.json lists no image"))
	}
	desc := im.Manifests[0]
	img, err := layoutImage(idx, desc)
	if err != nil {
		return bad(err)
	}
	digest, err := img.Digest()
	if err != nil {
		return bad(err)
	}
	m, err := img.Manifest()
	if err != nil {
		return bad(err)
	}
	layers := make([]layerSource, len(m.Layers))
	for i, d := range m.Layers {
		if !d.MediaType.IsLayer() || !d.MediaType.IsDistributable() {
			return bad(fmt.Errorf("layer %s has unsupported type %s", d.Digest, d.MediaType))
		}
		layers[i] = layerSource{digest: d.Digest, size: d.Size, open: func() (io.ReadCloser, error) {
			l, err := img.LayerByDigest(d.Digest)
			if err != nil {
				return nil, err
			}
			return l.Compressed()
		}}
	}
	if opts.Name == "" {
		opts.Name = layoutName(desc.Annotations, source)
	}
	if err := checkNewName(opts.Name); err != nil {
		return Image{}, err
	}
	out, err := imageFrom(opts.Name, source, img)
	if err != nil {
		return bad(err)
	}
	out.ManifestDigest = digest.String()
	out.Ref = layoutRef(desc.Annotations)
	if out, err = s.install(ctx, out, layers, opts.Progress); err != nil {
		return Image{}, fmt.Errorf("import %s: %w", source, err)
	}
	return out, nil
}

// layoutImage returns the image desc stands for in idx: itself, or for an
// index its linux/amd64 child, else its first.
func layoutImage(idx v1.ImageIndex, desc v1.Descriptor) (v1.Image, error) {
	for range 8 {
		if !desc.MediaType.IsIndex() {
			return idx.Image(desc.Digest)
		}
		child, err := idx.ImageIndex(desc.Digest)
		if err != nil {
			return nil, err
		}
		cm, err := child.IndexManifest()
		if err != nil {
			return nil, err
		}
		if len(cm.Manifests) == 0 {
			return nil, fmt.Errorf("index %s is empty", desc.Digest)
		}
		want, _ := v1.ParsePlatform(defaultPlatform)
		desc = cm.Manifests[0]
		for _, d := range cm.Manifests {
			if d.Platform != nil && d.Platform.Satisfies(*want) {
				desc = d
				break
			}
		}
		idx = child
	}
	return nil, errors.New("indexes nested too deep")
}

// layoutName derives an image name from an OCI layout's annotations, else
// from its file name.
func layoutName(ann map[string]string, source string) string {
	if n := DefaultName(ann["io.containerd.image.name"]); n != "" {
		return n
	}
	if ref := ann["org.opencontainers.image.ref.name"]; ref != "" {
		if strings.ContainsAny(ref, ":/") {
			if n := DefaultName(ref); n != "" {
				return n
			}
		}
		// Often just a tag.
		return sanitizeName(fileName(source) + "-" + ref)
	}
	return fileName(source)
}

// layoutRef is the reference an OCI layout's annotations name, "" if none.
func layoutRef(ann map[string]string) string {
	if r := NormalizeRef(ann["io.containerd.image.name"]); r != "" {
		return r
	}
	if ref := ann["org.opencontainers.image.ref.name"]; strings.ContainsAny(ref, ":/") {
		return NormalizeRef(ref)
	}
	return ""
}

// imageFrom starts the Image record of src.
func imageFrom(name, source string, src v1.Image) (Image, error) {
	cfg, err := src.ConfigFile()
	if err != nil {
		return Image{}, err
	}
	digest, err := src.ConfigName()
	if err != nil {
		return Image{}, err
	}
	img := Image{Name: name, Source: source, ConfigDigest: digest.String()}
	if cfg.OS != "" {
		img.Platform = cfg.Platform().String()
	}
	c := cfg.Config
	img.Config = Config{Env: c.Env, WorkingDir: c.WorkingDir, User: c.User, Entrypoint: c.Entrypoint, Cmd: c.Cmd}
	return img, nil
}

// install builds the image img from its layers, base first, and moves it into
// place: the shared tail of Pull and Import.
func (s *Store) install(ctx context.Context, img Image, layers []layerSource, progress func(Progress)) (Image, error) {
	b, err := s.begin(img.Name)
	if err != nil {
		return Image{}, err
	}
	defer b.close()
	rootfs := filepath.Join(b.dir, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return Image{}, err
	}
	p := Progress{LayersTotal: len(layers)}
	for _, l := range layers {
		p.BytesTotal += l.size
	}
	// At most every progressEvery in a layer: the callback may well be a
	// network round trip.
	var last time.Time
	report := func(force bool) {
		if progress != nil && (force || time.Since(last) >= progressEvery) {
			last = time.Now()
			progress(p)
		}
	}
	report(true)
	start := time.Now()
	img.Layers = make([]string, 0, len(layers))
	for i, l := range layers {
		p.Layer = ""
		if l.digest.Hex != "" {
			p.Layer = l.digest.String()
		}
		report(true)
		d, cached, err := s.addLayer(ctx, b, rootfs, l, func(n int64) { p.BytesDone += n; report(false) })
		if err != nil {
			return Image{}, fmt.Errorf("layer %d of %d %s: %w", i+1, len(layers), p.Layer, err)
		}
		if cached {
			p.Cached++
		}
		p.LayersDone++
		p.Layer = d.String()
		img.Layers = append(img.Layers, p.Layer)
	}
	if p.BytesTotal == 0 {
		p.BytesTotal = p.BytesDone
	}
	report(true)
	img.CreatedAt = time.Now().UTC()
	img.SizeBytes = DirSize(rootfs)
	img, err = s.commit(b, img)
	if err != nil {
		return Image{}, err
	}
	s.log.Info("image installed", "image", img.Name, "source", img.Source, "layers", len(layers),
		"cached", p.Cached, "size_mib", img.SizeBytes>>20, "took", time.Since(start).Round(time.Millisecond))
	return img, nil
}

// DefaultName derives an image name from an image reference:
// "python:3.12-slim" gives "python-3.12-slim", "ghcr.io/org/app:v1" gives
// "ghcr.io-org-app-v1", and a digest reference keeps 12 hex digits. Docker
// Hub's host and "library/" and the tag "latest" are left out. It returns ""
// if ref is not a reference.
func DefaultName(ref string) string {
	if ref == "" {
		return ""
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return ""
	}
	n := r.Context().RepositoryStr()
	if reg := r.Context().RegistryStr(); reg != name.DefaultRegistry {
		n = reg + "/" + n
	} else {
		n = strings.TrimPrefix(n, "library/")
	}
	switch r := r.(type) {
	case name.Digest:
		_, hex, _ := strings.Cut(r.DigestStr(), ":")
		n += "-" + hex[:min(12, len(hex))]
	case name.Tag:
		if r.TagStr() != "latest" {
			n += "-" + r.TagStr()
		}
	}
	return sanitizeName(n)
}

// sanitizeName maps s onto the characters ValidName allows.
func sanitizeName(s string) string {
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			b[i] = '-'
		}
	}
	n := strings.TrimLeft(string(b), "._-")
	if len(n) > 64 {
		n = strings.TrimRight(n[:64], "._-")
	}
	return n
}

// fileName derives an image name from a file name: "app.tar" gives "app".
func fileName(p string) string {
	b := filepath.Base(p)
	for _, ext := range []string{".tar", ".oci"} {
		b = strings.TrimSuffix(b, ext)
	}
	return sanitizeName(b)
}

// maxRef bounds an image reference: a registry host, a repository of at
// most 255 bytes, a tag of 128 or a digest, with room to spare.
const maxRef = 512

// checkRef checks that ref, from a client, can be an image reference before
// it reaches a parser, a log or a message: bounded, printable, no spaces.
func checkRef(ref string) error {
	switch {
	case ref == "":
		return errdefs.New(errdefs.InvalidArgument, "no image reference: name one, e.g. python:3.12-slim")
	case len(ref) > maxRef:
		return errdefs.New(errdefs.InvalidArgument, "image reference of %d bytes: at most %d", len(ref), maxRef)
	}
	for _, c := range ref {
		if c <= ' ' || c == 0x7f || c > 0x7e {
			return errdefs.New(errdefs.InvalidArgument, "bad image reference %q: use a reference like registry/repo:tag or repo@sha256:...", ref)
		}
	}
	return nil
}

// checkSource checks an import's source (a file name a client gave): it is
// shown back, so bounded and free of control characters.
func checkSource(src string) error {
	if len(src) > 4096 {
		return errdefs.New(errdefs.InvalidArgument, "source of %d bytes: at most 4096", len(src))
	}
	for _, c := range src {
		if c < ' ' || c == 0x7f {
			return errdefs.New(errdefs.InvalidArgument, "bad source %q: no control characters", src)
		}
	}
	return nil
}

// NormalizeRef returns the full form of the image reference ref, the form
// Ref records ("python:3.12-slim" gives
// "index.docker.io/library/python:3.12-slim", "app" gives
// "index.docker.io/library/app:latest"), or "" if ref is not a reference.
func NormalizeRef(ref string) string {
	if checkRef(ref) != nil {
		return ""
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return ""
	}
	return r.Name()
}

// FamiliarRef returns the short form of a normalized reference, the way
// Docker shows it: Docker Hub's host and "library/" left out.
func FamiliarRef(ref string) string {
	if rest, ok := strings.CutPrefix(ref, name.DefaultRegistry+"/"); ok {
		return strings.TrimPrefix(rest, "library/")
	}
	return ref
}

// checkNewName checks name can name a new image.
func checkNewName(name string) error {
	switch {
	case name == "":
		return errdefs.New(errdefs.InvalidArgument, "no image name: pass one")
	case name == blobsDir:
		return errdefs.New(errdefs.InvalidArgument, "image name %q is reserved: pass another", name)
	case !ValidName(name):
		return errdefs.New(errdefs.InvalidArgument, "bad image name %q: use at most 64 lower-case letters, digits, '.', '_' and '-'", name)
	}
	return nil
}
