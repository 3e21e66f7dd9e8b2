package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// qmp is a connection to one VM's QEMU Machine Protocol socket. Commands
// are serialised; events go to onEvent from the reader goroutine.
type qmp struct {
	nc      net.Conn
	onEvent func(name string, data json.RawMessage)

	mu      sync.Mutex // one command at a time
	replies chan qmpReply
	done    chan struct{}
	err     error
}

type qmpReply struct {
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	Event string          `json:"event"`
	Data  json.RawMessage `json:"data"`
	QMP   json.RawMessage `json:"QMP"`
}

// dialQMP connects to path, reads the greeting and enters command mode,
// retrying the connection until ctx ends (QEMU may still be making the
// socket).
func dialQMP(ctx context.Context, path string, onEvent func(string, json.RawMessage)) (*qmp, error) {
	var nc net.Conn
	var err error
	for {
		nc, err = (&net.Dialer{}).DialContext(ctx, "unix", path)
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("qmp %s: %w", path, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	q := &qmp{nc: nc, onEvent: onEvent, replies: make(chan qmpReply, 1), done: make(chan struct{})}
	greeting := make(chan error, 1)
	go q.read(greeting)
	select {
	case err := <-greeting:
		if err != nil {
			nc.Close()
			return nil, err
		}
	case <-ctx.Done():
		nc.Close()
		return nil, fmt.Errorf("qmp greeting: %w", ctx.Err())
	}
	if _, err := q.exec(ctx, "qmp_capabilities", nil); err != nil {
		q.Close()
		return nil, err
	}
	return q, nil
}

func (q *qmp) read(greeting chan<- error) {
	defer close(q.done)
	sc := bufio.NewScanner(q.nc)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	first := true
	for sc.Scan() {
		var r qmpReply
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			continue
		}
		switch {
		case first && r.QMP != nil:
			first = false
			greeting <- nil
		case r.Event != "":
			if q.onEvent != nil {
				q.onEvent(r.Event, r.Data)
			}
		default:
			select {
			case q.replies <- r:
			default: // nobody asked: a reply to a command whose caller gave up
			}
		}
	}
	q.err = sc.Err()
	if q.err == nil {
		q.err = errors.New("qmp connection closed")
	}
	if first {
		greeting <- q.err
	}
}

// exec runs one command and returns its "return" value.
func (q *qmp) exec(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	// Drop a stale reply left by a caller that gave up.
	select {
	case <-q.replies:
	default:
	}
	if _, err := q.nc.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("qmp %s: %w", cmd, err)
	}
	select {
	case r := <-q.replies:
		if r.Error != nil {
			return nil, fmt.Errorf("qmp %s: %s: %s", cmd, r.Error.Class, r.Error.Desc)
		}
		return r.Return, nil
	case <-q.done:
		return nil, fmt.Errorf("qmp %s: %w", cmd, q.err)
	case <-ctx.Done():
		return nil, fmt.Errorf("qmp %s: %w", cmd, ctx.Err())
	}
}

// Close drops the connection.
func (q *qmp) Close() error { return q.nc.Close() }

// waitMigration polls query-migrate until the migration completed or
// failed.
func (q *qmp) waitMigration(ctx context.Context) error {
	for {
		r, err := q.exec(ctx, "query-migrate", nil)
		if err != nil {
			return err
		}
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		_ = json.Unmarshal(r, &st)
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", st.Status, st.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("migration: %w", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}
