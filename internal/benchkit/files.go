package benchkit

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/clade-sandbox/clade/internal/tarx"
	"github.com/clade-sandbox/clade/sdk"
)

// Files is the throughput of file transfers through the SDK (tar streams
// over the API, the agent's connection inside): one large file, then many
// small ones, each pushed into a sandbox and pulled back out.
type Files struct {
	LargeMiB     int     `json:"large_mib"`
	PushMiBs     float64 `json:"push_mib_s"`
	PullMiBs     float64 `json:"pull_mib_s"`
	SmallFiles   int     `json:"small_files"`
	SmallKiB     int     `json:"small_kib"`
	PushFilesPS  float64 `json:"push_files_s"`
	PullFilesPS  float64 `json:"pull_files_s"`
	PushSmallMiB float64 `json:"push_small_mib_s"`
}

// filesSmallSize is the size of the files phase's small files.
const filesSmallSize = 4 << 10

// phaseFiles pushes a FilesMiB file (1 GiB) into a sandbox and pulls it
// back, then FilesSmall files of 4 KiB (10,000), all through the SDK's CopyTo and CopyFrom, and
// reports MiB/s and files/s. The data is random (nothing on the path can
// compress it) and the pulled archives are read to their end and counted.
// The sandbox gets a disk cap that holds both. No baseline: plain runsc
// has no file transfer of its own.
func (r *runner) phaseFiles(ctx context.Context, ph *Phase) {
	t := r.clade
	filesLargeMiB, filesSmall := r.cfg.FilesMiB, r.cfg.FilesSmall
	sb, err := t.c.CreateSandbox(ctx, sdk.CreateSandboxRequest{Name: t.name(), Image: t.image, MemoryMiB: t.memoryMiB, Engine: t.engine,
		DiskMiB: filesLargeMiB*2 + 1024})
	if err != nil {
		ph.Error = fmt.Sprintf("create: %v", err)
		return
	}
	t.add("sandbox", sb.ID)
	f := &Files{LargeMiB: filesLargeMiB, SmallFiles: filesSmall, SmallKiB: filesSmallSize >> 10}
	ph.Files = f
	chunk := make([]byte, 1<<20)
	_, _ = rand.Read(chunk)

	// The large file, into the root file system (not /tmp, which may be
	// memory the sandbox's limit counts).
	r.settle(ctx)
	r.prog.Update("files: push %d MiB", filesLargeMiB)
	size := int64(filesLargeMiB) << 20
	start := time.Now()
	err = t.c.CopyTo(ctx, sb.ID, "/var/tmp", tarx.Stream(func(tw *tar.Writer) error {
		if err := tw.WriteHeader(&tar.Header{Name: "large.bin", Mode: 0o644, Size: size, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		for left := size; left > 0; left -= int64(len(chunk)) {
			if _, err := tw.Write(chunk[:min(left, int64(len(chunk)))]); err != nil {
				return err
			}
		}
		return nil
	}))
	if err != nil {
		ph.Error = fmt.Sprintf("push %d MiB: %v", filesLargeMiB, err)
		return
	}
	f.PushMiBs = round3(float64(filesLargeMiB) / time.Since(start).Seconds())

	r.settle(ctx)
	r.prog.Update("files: pull %d MiB", filesLargeMiB)
	start = time.Now()
	got, n, err := pull(ctx, t.c, sb.ID, "/var/tmp/large.bin")
	if err == nil && (n != 1 || got != size) {
		err = fmt.Errorf("got %d bytes in %d files, want %d in 1", got, n, size)
	}
	if err != nil {
		ph.Error = fmt.Sprintf("pull %d MiB: %v", filesLargeMiB, err)
		return
	}
	f.PullMiBs = round3(float64(filesLargeMiB) / time.Since(start).Seconds())
	// Room for the small ones (and less for the page cache to hold).
	if st, err := t.c.Exec(ctx, sb.ID, sdk.ExecRequest{Cmd: []string{"rm", "/var/tmp/large.bin"}}); err != nil || st.Code != 0 {
		ph.Error = fmt.Sprintf("rm the large file: %v (exit %d)", err, st.Code)
		return
	}

	r.settle(ctx)
	r.prog.Update("files: push %d files of %d KiB", filesSmall, filesSmallSize>>10)
	start = time.Now()
	err = t.c.CopyTo(ctx, sb.ID, "/var/tmp", tarx.Stream(func(tw *tar.Writer) error {
		if err := tw.WriteHeader(&tar.Header{Name: "small/", Mode: 0o755, Typeflag: tar.TypeDir}); err != nil {
			return err
		}
		for i := range filesSmall {
			if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("small/f%05d", i), Mode: 0o644, Size: filesSmallSize, Typeflag: tar.TypeReg}); err != nil {
				return err
			}
			off := (i * filesSmallSize) % (len(chunk) - filesSmallSize)
			if _, err := tw.Write(chunk[off : off+filesSmallSize]); err != nil {
				return err
			}
		}
		return nil
	}))
	if err != nil {
		ph.Error = fmt.Sprintf("push %d files: %v", filesSmall, err)
		return
	}
	d := time.Since(start).Seconds()
	f.PushFilesPS = round3(float64(filesSmall) / d)
	f.PushSmallMiB = round3(float64(filesSmall*filesSmallSize) / (1 << 20) / d)

	r.settle(ctx)
	r.prog.Update("files: pull %d files", filesSmall)
	start = time.Now()
	got, n, err = pull(ctx, t.c, sb.ID, "/var/tmp/small")
	if err == nil && (n != filesSmall || got != int64(filesSmall*filesSmallSize)) {
		err = fmt.Errorf("got %d bytes in %d files, want %d in %d", got, n, filesSmall*filesSmallSize, filesSmall)
	}
	if err != nil {
		ph.Error = fmt.Sprintf("pull %d files: %v", filesSmall, err)
		return
	}
	f.PullFilesPS = round3(float64(filesSmall) / time.Since(start).Seconds())
}

// pull reads the archive of path to its end and returns the bytes of its
// regular files and how many there were.
func pull(ctx context.Context, c *sdk.Client, id, path string) (int64, int, error) {
	rc, err := c.CopyFrom(ctx, id, path)
	if err != nil {
		return 0, 0, err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var total int64
	files := 0
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return total, files, nil
		}
		if err != nil {
			return total, files, err
		}
		if h.Typeflag != tar.TypeReg || strings.HasSuffix(h.Name, "/") {
			continue
		}
		n, err := io.Copy(io.Discard, tr)
		if err != nil {
			return total, files, err
		}
		total += n
		files++
	}
}
