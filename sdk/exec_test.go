package sdk_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/clade-sandbox/clade/api"
	"github.com/clade-sandbox/clade/api/stream"
	"github.com/clade-sandbox/clade/sdk"
)

// TestStartExec: StartExec returns the daemon's frames in the order they
// were sent, io.EOF at the exit frame and the exit through Exit; a stream
// read to its exit gives its connection back to the pool, and one cut
// before its exit is an error. The daemon side is scripted: what is
// tested is the client's logic.
func TestStartExec(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req api.ExecRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Cmd) == 0 {
			http.Error(w, `{"code":"invalid_argument","message":"bad request"}`, http.StatusBadRequest)
			return
		}
		switch req.Cmd[0] {
		case "missing":
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"code":"not_found","message":"no sandbox x"}`))
			return
		}
		w.Header().Set("Content-Type", stream.ContentType)
		w.WriteHeader(http.StatusOK)
		out := stream.NewWriter(w, http.NewResponseController(w).Flush)
		_ = out.Write(stream.Started, []byte(`{"pid":7}`))
		_ = out.Write(stream.Stdout, []byte("a"))
		_ = out.Write(stream.Type(200), []byte("future"))
		_ = out.Write(stream.Stderr, []byte("b"))
		_ = out.Write(stream.Stdout, []byte("c"))
		if req.Cmd[0] == "cut" {
			return
		}
		_ = out.WriteLast(stream.Exit, []byte(`{"code":3}`))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	c, err := sdk.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		s, err := c.StartExec(t.Context(), "sb", sdk.ExecRequest{Cmd: []string{"run"}})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			f, err := s.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
			got = append(got, fmt.Sprintf("%d:%s", f.Type, f.Payload))
		}
		want := []string{`3:{"pid":7}`, "4:a", "200:future", "5:b", "4:c"}
		if !slices.Equal(got, want) {
			t.Fatalf("round %d: frames %q, want %q", i, got, want)
		}
		if st, err := s.Exit(); err != nil || st.Code != 3 {
			t.Fatalf("round %d: exit %+v %v, want code 3", i, st, err)
		}
		if _, err := s.Next(); err != io.EOF {
			t.Fatalf("round %d: Next after the exit: %v, want io.EOF", i, err)
		}
		s.Close()
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("3 streams read to their exit took %d connections, want 1 (kept alive)", n)
	}

	if _, err := c.StartExec(t.Context(), "sb", sdk.ExecRequest{Cmd: []string{"missing"}}); !sdk.IsNotFound(err) {
		t.Errorf("a refused exec: %v, want not found", err)
	}
	if _, err := c.StartExec(t.Context(), "sb", sdk.ExecRequest{Cmd: []string{"run"}, TTY: true}); !sdk.IsInvalidArgument(err) {
		t.Errorf("StartExec with a terminal: %v, want invalid argument", err)
	}

	s, err := c.StartExec(t.Context(), "sb", sdk.ExecRequest{Cmd: []string{"cut"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for {
		if _, err = s.Next(); err != nil {
			break
		}
	}
	if err == io.EOF {
		t.Fatal("a stream cut before its exit ended as io.EOF")
	}
	if _, xerr := s.Exit(); xerr == nil {
		t.Errorf("Exit of a cut stream: nil error (Next said %v)", err)
	}
	// Exec itself reads the same way.
	var out, errOut stringsBuilder
	st, err := c.Exec(t.Context(), "sb", sdk.ExecRequest{Cmd: []string{"run"}, Stdout: &out, Stderr: &errOut})
	if err != nil || st.Code != 3 || out.s != "ac" || errOut.s != "b" {
		t.Errorf("Exec: %+v %v, stdout %q stderr %q", st, err, out.s, errOut.s)
	}
}

type stringsBuilder struct{ s string }

func (b *stringsBuilder) Write(p []byte) (int, error) { b.s += string(p); return len(p), nil }
