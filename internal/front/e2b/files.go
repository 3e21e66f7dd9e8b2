package e2b

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/hostinfo"
	"github.com/clade-sandbox/clade/internal/service"
)

// getFile answers envd's GET /files?path=: the file's bytes.
func (s *Server) getFile(w http.ResponseWriter, r *http.Request) error {
	id := sandboxID(r.Header)
	p := resolve(r.URL.Query().Get("path"))
	fi, err := s.svc.Stat(r.Context(), id, service.Wake, p)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return errdefs.New(errdefs.NotFound, "path '%s' does not exist", p)
		}
		return err
	}
	if fi.IsDir {
		return errdefs.New(errdefs.InvalidArgument, "path '%s' is a directory: read files one by one", p)
	}
	rc, err := s.svc.CopyOut(r.Context(), id, service.Wake, p)
	if err != nil {
		return err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return errdefs.New(errdefs.NotFound, "path '%s' is not a regular file", p)
			}
			return err
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(h.Size, 10))
		w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": path.Base(p)}))
		w.WriteHeader(http.StatusOK)
		if _, err := io.Copy(w, tr); err != nil {
			s.log.Warn("e2b: file download failed", "sandbox", id, "path", p, "err", err)
			panic(http.ErrAbortHandler)
		}
		return nil
	}
}

// writtenEntry is envd's answer for one written file.
type writtenEntry struct {
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Path     string            `json:"path"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// postFiles answers envd's POST /files: multipart with one part per file
// (field "file", its filename the full path), or one octet-stream body
// written to ?path=; either may be gzip-encoded. Every file streams into
// the sandbox: nothing of it is written on the host (the data dir is not
// the sandbox's disk, and with encryption at rest nothing a client sends
// may land there in plaintext). What the body decodes to is bounded by
// the sandbox's disk cap and what the host can spare: past it the answer
// is a 413; a sandbox disk that fills up part way is a 507 (the SDKs'
// NotEnoughSpaceError).
func (s *Server) postFiles(w http.ResponseWriter, r *http.Request) error {
	id := sandboxID(r.Header)
	qpath := r.URL.Query().Get("path")
	named, err := checkUserName(r.URL.Query().Get("username"))
	if err != nil {
		return err
	}
	sb, err := s.get(r.Context(), id)
	if err != nil {
		return err
	}
	user, err := s.execUser(r.Context(), id, named)
	if err != nil {
		return err
	}
	md, err := uploadMetadata(r.Header)
	if err != nil {
		return err
	}
	if len(md) > 0 {
		// Refused before anything is written by a sandbox that cannot keep
		// it (an older agent's, another node's): asking for no path only
		// checks that.
		if _, err := s.svc.Xattrs(r.Context(), id, service.Wake, metadataXattr, nil); err != nil {
			return err
		}
	}
	limit, why := s.uploadLimit(sb)
	var body io.Reader = r.Body
	size := r.ContentLength // of the file, for an octet-stream body
	if enc := r.Header.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
		if !strings.EqualFold(enc, "gzip") {
			return errdefs.New(errdefs.InvalidArgument, "Content-Encoding %q: send the body as it is or gzip-encoded", enc)
		}
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			return errdefs.New(errdefs.InvalidArgument, "body is not gzip: %v", err)
		}
		defer zr.Close()
		body, size = zr, -1
	}
	capped := &capReader{r: body, left: limit, limit: limit, why: why}
	ct, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []writtenEntry
	switch {
	case ct == "multipart/form-data":
		if params["boundary"] == "" {
			return errdefs.New(errdefs.InvalidArgument, "bad multipart body: no boundary in the Content-Type")
		}
		mr := multipart.NewReader(capped, params["boundary"])
		for {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				if capped.over {
					return capped.err()
				}
				return errdefs.New(errdefs.InvalidArgument, "bad multipart body: %v", err)
			}
			// Part.FileName drops directories: the full path is the point.
			_, cd, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			if cd["name"] != "file" {
				part.Close()
				continue
			}
			target := cd["filename"]
			if target == "" || (qpath != "" && !strings.Contains(target, "/") && path.Base(qpath) == target) {
				target = qpath
			}
			if target == "" {
				return errdefs.New(errdefs.InvalidArgument, "a file part names no path: give ?path= or the full path as the part's filename")
			}
			e, err := s.writeFile(w, r.Context(), id, user, resolve(target), part, -1, capped)
			part.Close()
			if err == nil {
				e.Metadata, err = md, s.setMetadata(r.Context(), id, e.Path, md)
			}
			if err != nil {
				return err
			}
			out = append(out, e)
		}
	default:
		if qpath == "" {
			return errdefs.New(errdefs.InvalidArgument, "missing ?path=: the path to write the body to")
		}
		if size > limit {
			return capped.errFor(size)
		}
		e, err := s.writeFile(w, r.Context(), id, user, resolve(qpath), capped, size, capped)
		if err == nil {
			e.Metadata, err = md, s.setMetadata(r.Context(), id, e.Path, md)
		}
		if err != nil {
			return err
		}
		out = append(out, e)
	}
	if len(out) == 0 {
		return errdefs.New(errdefs.InvalidArgument, "no file in the request: send multipart parts named \"file\" or an octet-stream body")
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// uploadLimit is the most one upload into sb may decode to, and what
// bounds it: the sandbox's disk cap, and the data dir's free space above
// the disk floor (a sandbox's files take the host's disk).
func (s *Server) uploadLimit(sb api.Sandbox) (int64, string) {
	limit, why := int64(math.MaxInt64), ""
	if sb.DiskMiB > 0 {
		limit, why = int64(sb.DiskMiB)<<20, fmt.Sprintf("the sandbox's disk cap of %d MiB", sb.DiskMiB)
	}
	if s.cfg.DiskDir != "" {
		var st unix.Statfs_t
		if err := unix.Statfs(s.cfg.DiskDir, &st); err == nil {
			spare := int64(st.Bavail)*int64(st.Bsize) - int64(s.cfg.DiskFloorMiB)<<20
			if spare < limit {
				limit, why = max(spare, 0), fmt.Sprintf("the %d MiB the host can spare", max(spare, 0)>>20)
			}
		}
	}
	return limit, why
}

// capReader yields at most limit bytes of r; a byte more makes it fail
// with a 413 and set over.
type capReader struct {
	r     io.Reader
	left  int64
	limit int64
	why   string
	over  bool
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		var b [1]byte
		n, err := c.r.Read(b[:])
		if n > 0 {
			c.over = true
			return 0, c.err()
		}
		return 0, err
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}

func (c *capReader) err() error {
	return &statusError{status: http.StatusRequestEntityTooLarge, err: fmt.Errorf("the upload is larger than %s (%d bytes): nothing was written past it", c.why, c.limit)}
}

func (c *capReader) errFor(size int64) error {
	return &statusError{status: http.StatusRequestEntityTooLarge, err: fmt.Errorf("an upload of %d bytes is larger than %s (%d bytes)", size, c.why, c.limit)}
}

// inlineMax is the most of an upload of unknown size held in memory to
// learn its size: a file that ends within it goes in one archive entry.
const inlineMax = 1 << 20

// writeFile writes what r yields to p (absolute) in sandbox id as user
// (empty: root), making its parent directories, all owned by user. size is r's length, or -1 when unknown. Nothing is
// written on the host: a file of known size (or one that ends within
// inlineMax) goes through the agent's archive extraction, a larger one of
// unknown size through a process inside that writes its stdin. A failed
// write leaves no partial file.
func (s *Server) writeFile(w http.ResponseWriter, ctx context.Context, id, user, p string, r io.Reader, size int64, capped *capReader) (writtenEntry, error) {
	if p == "/" {
		return writtenEntry{}, errdefs.New(errdefs.InvalidArgument, "cannot write a file at /")
	}
	dir, name := path.Split(p)
	// CopyIn writes into an existing directory, but as the path itself
	// when it is missing: make the parents first.
	dir = path.Clean(dir)
	fi, err := s.svc.Stat(ctx, id, service.Wake, dir)
	switch {
	case errdefs.IsNotFound(err):
		if _, _, err := s.runAs(ctx, id, user, "mkdir", "-p", "--", dir); err != nil {
			return writtenEntry{}, fmt.Errorf("write %s: %w", p, err)
		}
	case err != nil:
		return writtenEntry{}, err
	case !fi.IsDir:
		return writtenEntry{}, errdefs.New(errdefs.InvalidArgument, "write %s: %s is not a directory", p, dir)
	default:
		// A directory at p is refused as envd does: the archive written
		// below replaces what is at p, and took a directory with every
		// file under it.
		if fi, err := s.svc.Stat(ctx, id, service.Wake, p); err == nil && fi.IsDir {
			return writtenEntry{}, errdefs.New(errdefs.InvalidArgument, "write %s: it is a directory", p)
		}
	}
	src := &bodyReader{r: r}
	r = src
	if size < 0 {
		head := make([]byte, inlineMax+1)
		n, err := io.ReadFull(r, head)
		switch {
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			r, size = bytes.NewReader(head[:n]), int64(n)
		case err != nil:
			return writtenEntry{}, uploadError(p, nil, src.failed(err), capped)
		default:
			if err := s.streamFile(w, ctx, id, user, p, io.MultiReader(bytes.NewReader(head), r), src, capped); err != nil {
				return writtenEntry{}, err
			}
			return writtenEntry{Name: name, Type: "file", Path: p}, nil
		}
	}
	pr, pw := io.Pipe()
	putErr, fillErr := feed(w, func() error {
		tw := tar.NewWriter(pw)
		err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: size, ModTime: time.Now(), Typeflag: tar.TypeReg})
		if err == nil {
			_, err = io.CopyN(tw, r, size)
		}
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
		return err
	}, func() error {
		// As envd writes: through a symlink at p, never replacing a
		// directory (made there since the check above too), with the
		// user's credentials. A node that cannot (another node's
		// service) extracts as CopyIn does, after the check above.
		if tw, ok := s.svc.(service.ThroughWriter); ok {
			return tw.WriteThrough(ctx, id, service.Wake, dir, user, pr)
		}
		return s.svc.CopyIn(ctx, id, service.Wake, dir, user, pr)
	}, func() { pr.CloseWithError(errors.New("upload ended")) })
	if err := uploadError(p, putErr, src.failed(fillErr), capped); err != nil {
		return writtenEntry{}, err
	}
	return writtenEntry{Name: name, Type: "file", Path: p}, nil
}

// streamFile writes r to p inside sandbox id by a process that copies its
// stdin into a temporary file beside p, moved onto p only once the whole
// upload is in: an archive entry needs its size up front, which an upload
// of unknown size has not, and a failed upload must leave neither a
// partial file nor the old one half overwritten (the process cannot tell
// a body that broke from one that ended: the host decides).
func (s *Server) streamFile(w http.ResponseWriter, ctx context.Context, id, user, p string, r io.Reader, src *bodyReader, capped *capReader) error {
	tmp := p + ".clade-upload-" + rand.Text()[:12]
	proc, err := s.svc.Exec(ctx, id, service.Wake, api.ExecRequest{Cmd: []string{"/bin/sh", "-c", `umask 022; exec cat > "$1"`, "sh", tmp}, Stdin: true, User: user, Workdir: "/"})
	if err != nil {
		return err
	}
	defer proc.Close()
	var exit api.ExitStatus
	var eb bytes.Buffer
	putErr, fillErr := feed(w, func() error {
		_, err := io.Copy(proc.Stdin(), r)
		if cerr := proc.Stdin().Close(); err == nil {
			err = cerr
		}
		return err
	}, func() error {
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = io.Copy(io.Discard, proc.Stdout())
		}()
		_, _ = io.Copy(&eb, io.LimitReader(proc.Stderr(), 64<<10))
		_, _ = io.Copy(io.Discard, proc.Stderr())
		<-done
		var err error
		exit, err = proc.Wait(ctx)
		if err == nil && (exit.Code != 0 || exit.Error != "") {
			msg := strings.TrimSpace(eb.String())
			if exit.Error != "" {
				msg = exit.Error
			}
			err = errdefs.New(writeClass(msg), "%s (exit status %d)", msg, exit.Code)
		}
		return err
	}, proc.Close)
	if err := uploadError(p, putErr, src.failed(fillErr), capped); err != nil {
		if _, _, rerr := s.runAs(context.WithoutCancel(ctx), id, user, "rm", "-f", "--", tmp); rerr != nil {
			err = errors.Join(err, fmt.Errorf("remove the partial upload %s: %w", tmp, rerr))
		}
		return err
	}
	// Moved as the user onto what p leads to (through its symlinks, as
	// envd writes), never onto a directory (mv -T fails there).
	if _, _, err := s.runAs(ctx, id, user, "/bin/sh", "-c", moveUpload, "sh", tmp, p); err != nil {
		_, _, rerr := s.runAs(context.WithoutCancel(ctx), id, user, "rm", "-f", "--", tmp)
		return errors.Join(fmt.Errorf("write %s: %w", p, err), rerr)
	}
	return nil
}

// writeClass is the class of a failed write's message (a shell's, from
// inside the sandbox): what the user may not write, or what cannot be
// written at all (/proc), is the request's fault, not the daemon's.
func writeClass(msg string) errdefs.Class {
	switch {
	case strings.Contains(msg, "Permission denied"), strings.Contains(msg, "Operation not permitted"),
		strings.Contains(msg, "Read-only file system"), strings.Contains(msg, "Is a directory"), strings.Contains(msg, "Not a directory"):
		return errdefs.InvalidArgument
	case strings.Contains(msg, "No such file or directory"):
		return errdefs.NotFound
	}
	return errdefs.Internal
}

// moveUpload moves a streamed upload $1 onto $2: onto what $2's symlinks
// lead to, refusing a directory.
const moveUpload = `t=$(readlink -m -- "$2") || exit 1
if [ -d "$t" ]; then echo "$2 is a directory" >&2; exit 1; fi
exec mv -fT -- "$1" "$t"`

// feed runs fill in its own goroutine and put meanwhile, and returns their
// errors. fill reads the request's body, which must not be read after the
// handler returns: once put has returned, abort makes fill's next write
// fail, and feed waits for fill to end; a fill still blocked on the client
// is cut off with a read deadline. (Set on a body read to its end, the
// deadline would break the kept-alive connection for the next request.)
func feed(w http.ResponseWriter, fill, put func() error, abort func()) (putErr, fillErr error) {
	filled := make(chan struct{})
	go func() {
		defer close(filled)
		fillErr = fill()
	}()
	putErr = put()
	abort()
	select {
	case <-filled:
	case <-time.After(time.Second):
		_ = http.NewResponseController(w).SetReadDeadline(time.Now())
		<-filled
	}
	return putErr, fillErr
}

// bodyReader notes the first error reading the upload gave, so that a
// broken body is told from a write that failed inside.
type bodyReader struct {
	r   io.Reader
	err error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF && b.err == nil {
		b.err = err
	}
	return n, err
}

// failed is the body's error behind a fill's err: what reading it failed
// with, io.ErrUnexpectedEOF when it ended short of its size, or nil when
// the fill failed writing (the write inside ended first).
func (b *bodyReader) failed(err error) error {
	switch {
	case b.err != nil:
		return b.err
	case errors.Is(err, io.EOF):
		return io.ErrUnexpectedEOF
	}
	return nil
}

// uploadError says why writing p failed, or nil: the upload over its
// limit (413), the sandbox's disk full (507, the SDKs'
// NotEnoughSpaceError), the client's body broken (400), or what the
// sandbox said.
func uploadError(p string, putErr, readErr error, capped *capReader) error {
	switch {
	case capped.over:
		return capped.err()
	case putErr != nil && strings.Contains(strings.ToLower(putErr.Error()), "no space left on device"):
		return &statusError{status: http.StatusInsufficientStorage, err: fmt.Errorf("write %s: not enough disk space in the sandbox: %w", p, putErr)}
	case readErr != nil:
		return errdefs.New(errdefs.InvalidArgument, "write %s: reading the upload: %v", p, readErr)
	case putErr != nil:
		return fmt.Errorf("write %s: %w", p, putErr)
	}
	return nil
}

// metric is E2B's SandboxMetric.
type metric struct {
	Timestamp  time.Time `json:"timestamp"`
	CPUUsedPct float64   `json:"cpuUsedPct"`
	CPUCount   int       `json:"cpuCount"`
	MemUsed    int64     `json:"memUsed"`
	MemTotal   int64     `json:"memTotal"`
	MemCache   int64     `json:"memCache"`
	DiskUsed   int64     `json:"diskUsed"`
	DiskTotal  int64     `json:"diskTotal"`
}

// sampleScript prints two /proc/stat cpu lines 200 ms apart, the memory
// lines of /proc/meminfo, the root file system's use in KiB and the CPU
// count.
const sampleScript = `head -n1 /proc/stat; sleep 0.2; head -n1 /proc/stat; grep -E '^(MemTotal|MemAvailable|Cached):' /proc/meminfo; df -kP / | tail -n1; nproc`

// sample measures a running sandbox from inside.
func (s *Server) sample(ctx context.Context, sb api.Sandbox) (metric, error) {
	out, _, err := s.run(ctx, sb.ID, "/bin/sh", "-c", sampleScript)
	if err != nil {
		return metric{}, err
	}
	m := metric{Timestamp: time.Now().UTC()}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 7 {
		return metric{}, errdefs.New(errdefs.Internal, "unexpected metrics sample %q", out)
	}
	busy1, total1 := hostinfo.CPUTimes(lines[0])
	busy2, total2 := hostinfo.CPUTimes(lines[1])
	if total2 > total1 {
		m.CPUUsedPct = 100 * float64(busy2-busy1) / float64(total2-total1)
	}
	mem := map[string]int64{}
	for _, l := range lines[2:5] {
		f := strings.Fields(l)
		if len(f) >= 2 {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			mem[strings.TrimSuffix(f[0], ":")] = n << 10
		}
	}
	m.MemTotal, m.MemCache = mem["MemTotal"], mem["Cached"]
	m.MemUsed = mem["MemTotal"] - mem["MemAvailable"]
	if f := strings.Fields(lines[5]); len(f) >= 3 {
		total, _ := strconv.ParseInt(f[1], 10, 64)
		used, _ := strconv.ParseInt(f[2], 10, 64)
		m.DiskTotal, m.DiskUsed = total<<10, used<<10
	}
	if sb.DiskMiB > 0 {
		m.DiskTotal = int64(sb.DiskMiB) << 20
	}
	m.CPUCount, _ = strconv.Atoi(strings.TrimSpace(lines[6]))
	return m, nil
}
