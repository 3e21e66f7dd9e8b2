package e2b_test

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"io/fs"
	"mime/multipart"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// newSandbox creates an E2B sandbox and returns its envd headers.
func newSandbox(t *testing.T, url, key string) map[string]string {
	t.Helper()
	var sb created
	if st, _ := rest(t, "POST", url+"/sandboxes", key, map[string]any{"templateID": "base", "timeout": 300}, &sb); st != http.StatusCreated {
		t.Fatalf("create: status %d", st)
	}
	return map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "49983", "X-Access-Token": sb.EnvdAccessToken}
}

// envdDo sends one envd request and returns its status and body.
func envdDo(t *testing.T, h map[string]string, method, url string, body io.Reader, size int64, hdr map[string]string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if size >= 0 {
		req.ContentLength = size
	}
	for k, v := range h {
		req.Header.Set(k, v)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// gzipBomb is gzip that decodes to n copies of 64 MiB of fill (one
// member, compressed once, repeated: gzip readers read members on).
func gzipBomb(t testing.TB, fill byte, n int) []byte {
	var m bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&m, gzip.BestCompression)
	if _, err := zw.Write(bytes.Repeat([]byte{fill}, 64<<20)); err != nil {
		t.Fatal(err)
	}
	zw.Close()
	return bytes.Repeat(m.Bytes(), n)
}

func gz(b []byte) []byte {
	var m bytes.Buffer
	zw := gzip.NewWriter(&m)
	zw.Write(b)
	zw.Close()
	return m.Bytes()
}

// diskBytes is what is allocated under root: its files' blocks, and those
// of deleted files under it that a process holds open (a running
// sandbox's upper layer is one), each file once.
func diskBytes(root string) int64 {
	var n int64
	seen := map[[2]uint64]bool{}
	add := func(st *syscall.Stat_t) {
		if k := [2]uint64{st.Dev, st.Ino}; !seen[k] {
			seen[k] = true
			n += st.Blocks * 512
		}
	}
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			var st syscall.Stat_t
			if syscall.Lstat(p, &st) == nil {
				add(&st)
			}
		}
		return nil
	})
	procs, _ := os.ReadDir("/proc")
	for _, pr := range procs {
		fds, _ := os.ReadDir(filepath.Join("/proc", pr.Name(), "fd"))
		for _, fd := range fds {
			p := filepath.Join("/proc", pr.Name(), "fd", fd.Name())
			target, err := os.Readlink(p)
			if err != nil || !strings.HasPrefix(target, root+"/") || !strings.HasSuffix(target, " (deleted)") {
				continue
			}
			var st syscall.Stat_t
			if syscall.Stat(p, &st) == nil {
				add(&st)
			}
		}
	}
	return n
}

// watchDisk samples diskBytes(root) until stop is called, which returns
// the most seen.
func watchDisk(root string) (stop func() int64) {
	var mu sync.Mutex
	peak := diskBytes(root)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tk := time.NewTicker(20 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-done:
				return
			case <-tk.C:
			}
			if b := diskBytes(root); b > func() int64 { mu.Lock(); defer mu.Unlock(); return peak }() {
				mu.Lock()
				peak = b
				mu.Unlock()
			}
		}
	}()
	return func() int64 {
		close(done)
		wg.Wait()
		if b := diskBytes(root); b > peak {
			peak = b
		}
		return peak
	}
}

// TestUploadBounded: an upload to /files streams into the sandbox and is
// bounded by its disk cap. A gzip body that decodes to 1 GiB, sent to a
// sandbox of 64 MiB, is refused with E2B's error body (413 past the cap,
// 507 when the sandbox's disk fills first) while the data dir grows by
// no more than the sandbox's cap (it spooled the whole GiB under the data
// dir's tmp before); a plain body whose length is over the cap is a 413
// before it is read. Files of every kind (small, large of known size,
// large of unknown size, multipart) still arrive whole.
func TestUploadBounded(t *testing.T) {
	t.Parallel() // a daemon of its own (startE2B)
	d, url, key := startE2B(t, "--default-disk", "64")
	h := newSandbox(t, url, key)

	bomb := gzipBomb(t, 0, 16)
	before := diskBytes(d.DataDir)
	stop := watchDisk(d.DataDir)
	start := time.Now()
	st, body := envdDo(t, h, "POST", url+"/files?path=/home/user/bomb", bytes.NewReader(bomb), int64(len(bomb)),
		map[string]string{"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"})
	took := time.Since(start)
	peak := stop()
	var e apiErr
	if err := json.Unmarshal(body, &e); err != nil || (st != 413 && st != 507) || e.Code != st || e.Message == "" {
		t.Errorf("gzip bomb: %d %s, want 413 or 507 with E2B's error body", st, body)
	}
	t.Logf("gzip bomb of %d bytes: %d in %v, data dir grew by at most %d MiB: %s", len(bomb), st, took.Round(time.Millisecond), (peak-before)>>20, e.Message)
	if grew := peak - before; grew > 128<<20 {
		t.Errorf("the data dir grew by %d MiB during a gzip bomb to a sandbox of 64 MiB", grew>>20)
	}
	if ents, _ := os.ReadDir(filepath.Join(d.DataDir, "tmp")); len(ents) > 0 {
		t.Errorf("the upload left %d files in the data dir's tmp", len(ents))
	}
	// Nothing of it stays in the sandbox either: no partial file, no
	// temporary one.
	st, got := envdDo(t, h, "POST", url+"/filesystem.Filesystem/ListDir", strings.NewReader(`{"path":"/home/user"}`), -1,
		map[string]string{"Content-Type": "application/json", "Connect-Protocol-Version": "1"})
	if st != 200 || strings.Contains(string(got), "bomb") {
		t.Errorf("after the refused upload, /home/user lists %d %s", st, got)
	}

	t.Run("declared length over the cap", func(t *testing.T) {
		const n = 100 << 20
		st, body := envdDo(t, h, "POST", url+"/files?path=/home/user/big", io.LimitReader(zeros{}, n), n,
			map[string]string{"Content-Type": "application/octet-stream"})
		var e apiErr
		if err := json.Unmarshal(body, &e); err != nil || st != 413 || e.Code != 413 || !strings.Contains(e.Message, "disk cap of 64 MiB") {
			t.Fatalf("%d %s, want a 413 naming the disk cap", st, body)
		}
	})

	rnd := func(n int) []byte {
		b := make([]byte, n)
		rand.Read(b)
		return b
	}
	small, large := rnd(1000), rnd(3<<20+17)
	multipartBody := func(target string, b []byte) (io.Reader, string) {
		var m bytes.Buffer
		mw := multipart.NewWriter(&m)
		fw, _ := mw.CreateFormFile("file", target)
		fw.Write(b)
		mw.Close()
		return &m, mw.FormDataContentType()
	}
	for _, tc := range []struct {
		name string
		data []byte
		send func(p string) (io.Reader, int64, map[string]string)
	}{
		{"small", small, func(string) (io.Reader, int64, map[string]string) {
			return bytes.NewReader(small), int64(len(small)), map[string]string{"Content-Type": "application/octet-stream"}
		}},
		{"large, known length", large, func(string) (io.Reader, int64, map[string]string) {
			return bytes.NewReader(large), int64(len(large)), map[string]string{"Content-Type": "application/octet-stream"}
		}},
		{"large, chunked", large, func(string) (io.Reader, int64, map[string]string) {
			return io.MultiReader(bytes.NewReader(large)), -1, map[string]string{"Content-Type": "application/octet-stream"}
		}},
		{"large, gzip", large, func(string) (io.Reader, int64, map[string]string) {
			return bytes.NewReader(gz(large)), -1, map[string]string{"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}
		}},
		{"large, multipart", large, func(p string) (io.Reader, int64, map[string]string) {
			r, ct := multipartBody(p, large)
			return r, -1, map[string]string{"Content-Type": ct}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := "/home/user/up/" + strings.ReplaceAll(tc.name, " ", "_")
			r, n, hdr := tc.send(p)
			if n < 0 {
				r = io.MultiReader(r) // no length: chunked
			}
			if st, body := envdDo(t, h, "POST", url+"/files?path="+p, r, n, hdr); st != 200 || !strings.Contains(string(body), `"path":"`+p+`"`) {
				t.Fatalf("upload: %d %s", st, body)
			}
			st, got := envdDo(t, h, "GET", url+"/files?path="+p, nil, -1, nil)
			if st != 200 || !bytes.Equal(got, tc.data) {
				t.Fatalf("read back: %d, %d bytes, want the %d sent", st, len(got), len(tc.data))
			}
		})
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// vmHWM is the peak resident memory of process pid, in bytes.
func vmHWM(t *testing.T, pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmHWM:" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n << 10
		}
	}
	t.Fatal("no VmHWM in /proc/PID/status")
	return 0
}

// TestConnectBodyBounded: a gzip-encoded Connect request that decodes to
// 512 MiB of JSON (a 512 KB body) is refused at once with Connect's
// resource_exhausted, and the daemon's peak memory stays low (it took the
// daemon to 1.8 GB before).
func TestConnectBodyBounded(t *testing.T) {
	t.Parallel() // a daemon of its own (startE2B)
	d, url, key := startE2B(t)
	h := newSandbox(t, url, key)
	body := append(append(gz([]byte(`{"path":"`)), gzipBomb(t, 'a', 8)...), gz([]byte(`"}`))...)
	start := time.Now()
	st, got := envdDo(t, h, "POST", url+"/filesystem.Filesystem/Stat", bytes.NewReader(body), int64(len(body)),
		map[string]string{"Content-Type": "application/json", "Content-Encoding": "gzip", "Connect-Protocol-Version": "1"})
	took := time.Since(start)
	hwm := vmHWM(t, d.Pid())
	t.Logf("%d bytes: %d %s in %v; the daemon's VmHWM %d MiB", len(body), st, got, took.Round(time.Millisecond), hwm>>20)
	var ce struct{ Code string }
	if err := json.Unmarshal(got, &ce); err != nil || st == 200 || ce.Code != "resource_exhausted" {
		t.Errorf("answered %d %s, want Connect's resource_exhausted", st, got)
	}
	if took > 5*time.Second {
		t.Errorf("the refusal took %v", took)
	}
	if hwm > 200<<20 {
		t.Errorf("the daemon's peak memory is %d MiB after one %d-byte request", hwm>>20, len(body))
	}
	// A request in bounds is still served.
	st, got = envdDo(t, h, "POST", url+"/filesystem.Filesystem/Stat", strings.NewReader(`{"path":"/"}`), -1,
		map[string]string{"Content-Type": "application/json", "Connect-Protocol-Version": "1"})
	if st != 200 || !strings.Contains(string(got), `"entry"`) {
		t.Errorf("Stat / answered %d %s", st, got)
	}
}

// TestUploadNotSpooledInPlaintext: with --encrypt-at-rest, a file
// uploaded through /files is nowhere in plaintext under the data dir,
// not even while it is still being sent (it was spooled in the data
// dir's tmp).
func TestUploadNotSpooledInPlaintext(t *testing.T) {
	t.Parallel() // a daemon of its own (startE2B)
	if _, err := exec.LookPath("gocryptfs"); err != nil {
		t.Skip("gocryptfs is not installed (make deps)")
	}
	d, url, key := startE2B(t, "--encrypt-at-rest")
	h := newSandbox(t, url, key)
	mb := make([]byte, 8)
	rand.Read(mb)
	marker := "clade-upload-" + hex.EncodeToString(mb)
	plain := filepath.Join(d.DataDir, "plain")
	pr, pw := io.Pipe()
	type answer struct {
		st   int
		body []byte
	}
	res := make(chan answer, 1)
	go func() {
		st, b := envdDo(t, h, "POST", url+"/files?path=/home/user/secret.txt", pr, -1, map[string]string{"Content-Type": "application/octet-stream"})
		res <- answer{st, b}
	}()
	// The marker, then far more than the sockets buffer: once written, the
	// daemon has taken the marker in.
	pad := bytes.Repeat([]byte("x"), 1<<20)
	if _, err := pw.Write([]byte(marker)); err != nil {
		t.Fatal(err)
	}
	for range 32 {
		if _, err := pw.Write(pad); err != nil {
			t.Fatal(err)
		}
	}
	for m, where := range testenv.FindMarkers(d.DataDir, plain, []string{marker}) {
		t.Errorf("while uploading, marker %s is in plaintext on disk: %v", m, where)
	}
	pw.Close()
	a := <-res
	if a.st != 200 {
		t.Fatalf("upload: %d %s", a.st, a.body)
	}
	if st, got := envdDo(t, h, "GET", url+"/files?path=/home/user/secret.txt", nil, -1, nil); st != 200 || !bytes.HasPrefix(got, []byte(marker)) || len(got) != len(marker)+32<<20 {
		t.Fatalf("read back: %d, %d bytes", st, len(got))
	}
	for m, where := range testenv.FindMarkers(d.DataDir, plain, []string{marker}) {
		t.Errorf("after the upload, marker %s is in plaintext on disk: %v", m, where)
	}
}

// TestUploadOntoDirectory: an upload to the path of a directory is a 400
// and the directory keeps its files (the archive the upload writes
// replaced the directory, every file under it lost), small or streamed.
func TestUploadOntoDirectory(t *testing.T) {
	t.Parallel() // a daemon of its own (startE2B)
	d, url, key := startE2B(t)
	h := newSandbox(t, url, key)
	id := h["E2b-Sandbox-Id"]
	if st, err := d.Client.Exec(t.Context(), id, sdk.ExecRequest{Cmd: []string{"sh", "-c", "mkdir -p /home/user/d/sub && echo keep > /home/user/d/sub/f && echo keep > /home/user/d/g"}}); err != nil || st.Code != 0 {
		t.Fatalf("setup: %+v %v", st, err)
	}
	for _, body := range []string{"hi", strings.Repeat("z", 100000)} {
		st, got := envdDo(t, h, "POST", url+"/files?path=/home/user/d", strings.NewReader(body), -1, map[string]string{"Content-Type": "application/octet-stream", "X-Metadata-Owner": "alice"})
		if st != http.StatusBadRequest || !strings.Contains(string(got), "is a directory") {
			t.Errorf("an upload of %d bytes onto a directory: %d %s, want a 400", len(body), st, got)
		}
		for _, p := range []string{"/home/user/d/g", "/home/user/d/sub/f"} {
			if st, got := envdDo(t, h, "GET", url+"/files?path="+p, nil, -1, nil); st != 200 || string(got) != "keep\n" {
				t.Fatalf("after an upload of %d bytes onto its directory, %s: %d %q", len(body), p, st, got)
			}
		}
	}
}

// TestUploadThrough: as E2B's envd, an upload onto a symlink writes
// through it (small, or streamed at an unknown size), but as the user: a
// link to a file the user may not write (root's /etc/shadow) is refused,
// the file untouched; an upload to /proc is a 4xx, not a 500.
func TestUploadThrough(t *testing.T) {
	t.Parallel() // a daemon of its own (startE2B)
	d, url, key := startE2B(t)
	h := newSandbox(t, url, key)
	id := h["E2b-Sandbox-Id"]
	sh := func(user, script string) string {
		t.Helper()
		var out strings.Builder
		if st, err := d.Client.Exec(t.Context(), id, sdk.ExecRequest{Cmd: []string{"sh", "-c", script}, User: user, Stdout: &out}); err != nil || st.Code != 0 {
			t.Fatalf("%s: %+v %v", script, st, err)
		}
		return out.String()
	}
	sh("user", "cd /home/user && echo old > real && ln -s real link && ln -s /etc/shadow evil")
	shadow := sh("root", "sha256sum /etc/shadow")
	octet := map[string]string{"Content-Type": "application/octet-stream"}
	big := strings.Repeat("b", 3<<20)
	for _, body := range []string{"new", big} {
		// A reader of no known length: past inlineMax it is streamed.
		st, got := envdDo(t, h, "POST", url+"/files?path=/home/user/link", io.MultiReader(strings.NewReader(body)), -1, octet)
		if st != http.StatusOK {
			t.Fatalf("an upload of %d bytes onto a link: %d %s", len(body), st, got)
		}
		if out := sh("user", "test -L /home/user/link && wc -c < /home/user/real && ls -a /home/user | grep -c clade-upload || true"); out != strconv.Itoa(len(body))+"\n0\n" {
			t.Fatalf("after an upload of %d bytes through the link: %q, want the link kept, real written, nothing left", len(body), out)
		}
		st, got = envdDo(t, h, "POST", url+"/files?path=/home/user/evil", io.MultiReader(strings.NewReader(body)), -1, octet)
		if st < 400 || st >= 500 {
			t.Fatalf("an upload of %d bytes as user through a link to /etc/shadow: %d %s, want a 4xx", len(body), st, got)
		}
		if sh("root", "sha256sum /etc/shadow") != shadow {
			t.Fatalf("/etc/shadow was written through the user's link")
		}
		st, got = envdDo(t, h, "POST", url+"/files?path=/proc/x", io.MultiReader(strings.NewReader(body)), -1, octet)
		if st < 400 || st >= 500 {
			t.Fatalf("an upload of %d bytes to /proc/x: %d %s, want a 4xx", len(body), st, got)
		}
	}
}
