package e2b

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/hostinfo"
	"github.com/clade-sandbox/clade/internal/store"
	"github.com/clade-sandbox/clade/internal/tarx"
)

// getFile answers envd's GET /files?path=: the file's bytes.
func (s *Server) getFile(w http.ResponseWriter, r *http.Request) error {
	id := sandboxID(r.Header)
	p := resolve(r.URL.Query().Get("path"))
	g, err := s.mgr.Guest(r.Context(), id)
	if err != nil {
		return err
	}
	fi, err := g.Stat(r.Context(), p)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return errdefs.New(errdefs.NotFound, "path '%s' does not exist", p)
		}
		return err
	}
	if fi.IsDir {
		return errdefs.New(errdefs.InvalidArgument, "path '%s' is a directory: read files one by one", p)
	}
	rc, err := g.CopyOut(r.Context(), p, nil)
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
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// postFiles answers envd's POST /files: multipart with one part per file
// (field "file", its filename the full path), or one octet-stream body
// (optionally gzip-encoded) written to ?path=.
func (s *Server) postFiles(w http.ResponseWriter, r *http.Request) error {
	id := sandboxID(r.Header)
	qpath := r.URL.Query().Get("path")
	ct, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []writtenEntry
	switch {
	case ct == "multipart/form-data":
		mr, err := r.MultipartReader()
		if err != nil {
			return errdefs.New(errdefs.InvalidArgument, "bad multipart body: %v", err)
		}
		_ = params
		for {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
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
			e, err := s.writeFile(r.Context(), id, resolve(target), part)
			part.Close()
			if err != nil {
				return err
			}
			out = append(out, e)
		}
	default:
		if qpath == "" {
			return errdefs.New(errdefs.InvalidArgument, "missing ?path=: the path to write the body to")
		}
		var body io.Reader = r.Body
		if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				return errdefs.New(errdefs.InvalidArgument, "body is not gzip: %v", err)
			}
			defer zr.Close()
			body = zr
		}
		e, err := s.writeFile(r.Context(), id, resolve(qpath), body)
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

// writeFile writes what r yields to p (absolute) in sandbox id, making its
// parent directories.
func (s *Server) writeFile(ctx context.Context, id, p string, r io.Reader) (writtenEntry, error) {
	if p == "/" {
		return writtenEntry{}, errdefs.New(errdefs.InvalidArgument, "cannot write a file at /")
	}
	// The tar header needs the size first: spool the upload.
	f, err := os.CreateTemp(s.cfg.TmpDir, "e2b-upload-")
	if err != nil {
		return writtenEntry{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	size, err := io.Copy(f, r)
	if err != nil {
		return writtenEntry{}, errdefs.New(errdefs.InvalidArgument, "reading the upload: %v", err)
	}
	g, err := s.mgr.Guest(ctx, id)
	if err != nil {
		return writtenEntry{}, err
	}
	dir, name := path.Split(p)
	put := func() error {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		pr := tarx.Stream(func(tw *tar.Writer) error {
			if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: size, ModTime: time.Now(), Typeflag: tar.TypeReg}); err != nil {
				return err
			}
			_, err := io.Copy(tw, io.LimitReader(f, size))
			return err
		})
		err := g.CopyIn(ctx, dir, pr)
		pr.CloseWithError(errors.New("upload ended"))
		return err
	}
	// CopyIn writes into an existing directory, but as the path itself
	// when it is missing: make the parents first.
	dir = path.Clean(dir)
	fi, err := g.Stat(ctx, dir)
	switch {
	case errdefs.IsNotFound(err):
		if _, _, err := s.run(ctx, id, "mkdir", "-p", "--", dir); err != nil {
			return writtenEntry{}, fmt.Errorf("write %s: %w", p, err)
		}
	case err != nil:
		return writtenEntry{}, err
	case !fi.IsDir:
		return writtenEntry{}, errdefs.New(errdefs.InvalidArgument, "write %s: %s is not a directory", p, dir)
	}
	if err := put(); err != nil {
		return writtenEntry{}, fmt.Errorf("write %s: %w", p, err)
	}
	return writtenEntry{Name: name, Type: "file", Path: p}, nil
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
func (s *Server) sample(ctx context.Context, sb store.Sandbox) (metric, error) {
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
	if sb.Opts.DiskMiB > 0 {
		m.DiskTotal = int64(sb.Opts.DiskMiB) << 20
	}
	m.CPUCount, _ = strconv.Atoi(strings.TrimSpace(lines[6]))
	return m, nil
}
