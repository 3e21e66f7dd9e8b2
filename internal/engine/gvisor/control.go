package gvisor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A checkpoint through runsc's own control socket, without starting runsc.
//
// `runsc checkpoint` is a 100 MB Go binary that starts, reads the
// container's state file, connects to the sandbox's control socket
// (<root>/runsc-<id>.sock) and makes one urpc call,
// containerManager.Checkpoint, passing the image's files. Starting it is
// most of its cost on a busy host: `runsc --version` alone took 130-270 ms
// at load 20 here, more than the save itself. The engine makes that one
// call itself. urpc is a JSON object per message on a stream socket, with
// the call's files as SCM_RIGHTS on the first write; the answer is
// {"success", "err", "result"}.
//
// The call's argument is runsc's control.SaveOpts, which is internal to
// runsc, so the engine uses this path only with the runsc versions it was
// checked against (directVersions); any other runsc is driven through its
// command line as before.

// directVersions are the `runsc --version` first lines whose control
// protocol matches saveOpts below (the version tools/runsc pins).
var directVersions = []string{
	"runsc version v0.0.0-20260905035102-160fafc42237",
}

// saveOpts is the JSON of runsc's control.SaveOpts (pkg/sentry/control).
type saveOpts struct {
	Metadata      map[string]string `json:"metadata"`
	HavePagesFile bool              `json:"have_pages_file"`
	Resume        bool              `json:"Resume"`
	ExecOpts      struct {
		ContainerID string `json:"ContainerID"`
	} `json:"ExecOpts"`
}

type urpcCall struct {
	Method string `json:"method"`
	Arg    any    `json:"arg"`
}

type urpcResult struct {
	Success bool   `json:"success"`
	Err     string `json:"err"`
}

// controlSocket is the path of id's control socket, runsc's
// createControlSocket naming under the engine's --root.
func (e *Engine) controlSocket(id string) string {
	return filepath.Join(e.runRoot, "runsc-"+id+".sock")
}

// direct says whether checkpoints go through the control socket.
func (e *Engine) direct(ctx context.Context) bool {
	e.directOnce.Do(func() {
		if e.cfg.NoDirectControl {
			return
		}
		v := e.RunscVersion(ctx)
		for _, ok := range directVersions {
			if v == ok {
				e.directOK = true
			}
		}
		if !e.directOK {
			e.cfg.Log.Info("runsc's control protocol is not the one this build knows: checkpoints run `runsc checkpoint`", "runsc", v)
		}
	})
	return e.directOK
}

// checkpointDirect checkpoints id into image, leaving it running, with the
// one call `runsc checkpoint --leave-running` makes. The image's files are
// made as runsc makes them (uncompressed: state, pages metadata, pages).
func (e *Engine) checkpointDirect(ctx context.Context, id, image string) (err error) {
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for _, name := range []string{"checkpoint.img", "pages_meta.img", "pages.img"} {
		f, err := os.OpenFile(filepath.Join(image, name), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
		if err != nil {
			return fmt.Errorf("checkpoint %s: %w", id, err)
		}
		files = append(files, f)
	}
	opts := saveOpts{Metadata: map[string]string{"compression": "none"}, HavePagesFile: true, Resume: true}
	opts.ExecOpts.ContainerID = id
	if err := e.controlCall(ctx, id, "containerManager.Checkpoint", opts, files); err != nil {
		return fmt.Errorf("checkpoint %s: %w", id, err)
	}
	return nil
}

// controlCall makes one urpc call to id's sandbox and waits for its answer
// (or ctx).
func (e *Engine) controlCall(ctx context.Context, id, method string, arg any, files []*os.File) error {
	path := e.controlSocket(id)
	if len(path) >= len(unix.RawSockaddrUnix{}.Path) {
		// Too long for a socket address: reach it through an O_PATH fd,
		// as runsc does.
		fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("control socket: %w", err)
		}
		defer unix.Close(fd)
		path = "/proc/self/fd/" + strconv.Itoa(fd)
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	defer nc.Close()
	uc := nc.(*net.UnixConn)
	stop := context.AfterFunc(ctx, func() { uc.SetDeadline(time.Now()) })
	defer stop()
	msg, err := json.Marshal(urpcCall{Method: method, Arg: arg})
	if err != nil {
		return err
	}
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	n, _, err := uc.WriteMsgUnix(msg, unix.UnixRights(fds...), nil)
	if err == nil && n < len(msg) {
		_, err = uc.Write(msg[n:])
	}
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	if method == "containerManager.Checkpoint" {
		// The sandbox is pausing for its checkpoint.
		e.crashPoint("gvisor-checkpoint-sent")
	}
	var res urpcResult
	if err := json.NewDecoder(bufio.NewReader(uc)).Decode(&res); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("control socket: no answer: %w", err)
	}
	if !res.Success {
		return errors.New(strings.TrimSpace(res.Err))
	}
	return nil
}
