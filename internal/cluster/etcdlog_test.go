package cluster

import (
	"bytes"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestEtcdLogger: etcd's warnings and errors reach the daemon's log with
// their fields, its info does not, and a repeated message is written once
// per etcdLogEvery with the count of those held back.
func TestEtcdLogger(t *testing.T) {
	var buf syncBuf
	lg := etcdLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	lg.Info("ready to serve")
	lg.With(zap.String("local-member-id", "abc")).Warn("slow fdatasync", zap.Duration("took", 2*time.Second))
	lg.Warn("slow fdatasync", zap.Duration("took", 3*time.Second))
	lg.Error("lost the TCP streaming connection with remote peer")
	out := buf.String()
	for _, want := range []string{`level=WARN msg="etcd: slow fdatasync"`, "local-member-id=abc", "took=2s",
		`level=ERROR msg="etcd: lost the TCP streaming connection with remote peer"`} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "ready to serve") || strings.Count(out, "slow fdatasync") != 1 {
		t.Errorf("info written, or the repeat not held back:\n%s", out)
	}
	// A repeat after the window comes with the count held back.
	core := lg.Core()
	e := zapcore.Entry{Level: zapcore.WarnLevel, Message: "slow fdatasync", Time: time.Now().Add(etcdLogEvery + time.Second)}
	if ce := core.Check(e, nil); ce == nil {
		t.Fatal("a warning not taken")
	} else {
		ce.Write()
	}
	if out := buf.String(); strings.Count(out, "slow fdatasync") != 2 || !strings.Contains(out, "repeats_not_shown=1") {
		t.Errorf("the repeat after the window:\n%s", out)
	}
}

// TestEmbedLogsLeader: a member given a log says who leads once it serves.
func TestEmbedLogsLeader(t *testing.T) {
	var buf syncBuf
	e, err := StartEmbed(t.Context(), Embed{Name: "lg", Dir: filepath.Join(t.TempDir(), "etcd"), Client: freeAddr(t), Peer: freeAddr(t),
		Log: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(buf.String(), `msg="cluster: etcd leader" leader=lg`); {
		if time.Now().After(deadline) {
			t.Fatalf("no leader line:\n%s", buf.String())
		}
		time.Sleep(10 * time.Millisecond) // polling the log for the line
	}
}
