package httpapi_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/clade-sandbox/clade/internal/testenv"
	"github.com/clade-sandbox/clade/sdk"
)

// TestHalfClosedClientGetsItsSandbox: a client that shuts down its side
// of the socket once its request is sent (socat, `nc -N`, HTTP/1.0 style
// clients) is still there to read the answer. Go's server cancels the
// request's context at that EOF as it does for a client that went away;
// the create must still answer 201 with a sandbox that exists, not remove
// it and answer an empty 200.
func TestHalfClosedClientGetsItsSandbox(t *testing.T) {
	t.Parallel() // a daemon of its own: see TestMain
	d := testenv.StartDaemon(t)
	conn, err := net.Dial("unix", d.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body, _ := json.Marshal(sdk.CreateSandboxRequest{MemoryMiB: 128})
	req, _ := http.NewRequest("POST", "http://clade/v1/sandboxes", bytes.NewReader(body))
	if err := req.Write(conn); err != nil {
		t.Fatal(err)
	}
	if err := conn.(*net.UnixConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create from a half-closed client: %d %q, want 201", resp.StatusCode, out)
	}
	var sb sdk.Sandbox
	if err := json.Unmarshal(out, &sb); err != nil || sb.ID == "" {
		t.Fatalf("answer %q: %v", out, err)
	}
	got, err := d.Client.GetSandbox(t.Context(), sb.ID)
	if err != nil || got.State != "running" {
		t.Fatalf("the answered sandbox %s: %+v %v", sb.ID, got, err)
	}
	_ = d.Client.DeleteSandbox(t.Context(), sb.ID)
}
