package httpapi_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/clade-sandbox/clade/internal/testenv"
)

// TestImportNotSpooledInPlaintext: with --encrypt-at-rest, an image
// archive being uploaded for import is spooled only in the encrypted view:
// a marker in it is nowhere in plaintext under the data dir while it is
// sent (it was in the data dir's tmp), and nothing of it stays after.
func TestImportNotSpooledInPlaintext(t *testing.T) {
	if _, err := exec.LookPath("gocryptfs"); err != nil {
		t.Skip("gocryptfs is not installed (make deps)")
	}
	d := testenv.StartDaemon(t, "--encrypt-at-rest")
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", d.Socket)
	}}}
	mb := make([]byte, 8)
	rand.Read(mb)
	marker := "clade-import-" + hex.EncodeToString(mb)
	plain := filepath.Join(d.DataDir, "plain")
	pr, pw := io.Pipe()
	status := make(chan int, 1)
	go func() {
		res, err := hc.Post("http://clade/v1/images/import?name=spooled", "application/x-tar", pr)
		if err != nil {
			status <- -1
			return
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		status <- res.StatusCode
	}()
	// The marker, then far more than the sockets buffer: once written, the
	// daemon has taken the marker in.
	if _, err := pw.Write([]byte(marker)); err != nil {
		t.Fatal(err)
	}
	pad := bytes.Repeat([]byte("x"), 1<<20)
	for range 32 {
		if _, err := pw.Write(pad); err != nil {
			t.Fatal(err)
		}
	}
	if inPlain := testenv.FindMarkers(plain, "", []string{marker}); len(inPlain) == 0 {
		t.Errorf("the plain view does not hold the spooled archive: the scan cannot tell")
	}
	for m, where := range testenv.FindMarkers(d.DataDir, plain, []string{marker}) {
		t.Errorf("while importing, marker %s is in plaintext on disk: %v", m, where)
	}
	pw.Close()
	if st := <-status; st < 400 || st >= 500 {
		t.Errorf("importing a non-archive answered %d, want a 4xx", st)
	}
	for _, dir := range []string{filepath.Join(d.DataDir, "tmp"), filepath.Join(plain, "tmp")} {
		if ents, _ := os.ReadDir(dir); len(ents) > 0 {
			t.Errorf("the import left %d files in %s", len(ents), dir)
		}
	}
}
