package e2b

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/clade-sandbox/clade/internal/errdefs"
	"github.com/clade-sandbox/clade/internal/front/e2b/envdpb/filesystem"
	"github.com/clade-sandbox/clade/internal/service"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// filesystemService implements envd's Filesystem service with coreutils
// and findutils run in the sandbox by clade's agent.
type filesystemService struct {
	s *Server
}

// entryFormat is find's -printf format of one entry: type, size, mode,
// owner, group, mtime, symlink target, path; NUL-terminated.
const entryFormat = `%y\t%s\t%m\t%u\t%g\t%T@\t%l\t%p\0`

// entries runs find at p (absolute) with args and parses what it prints.
func (f *filesystemService) entries(ctx context.Context, id, p string, args ...string) ([]*filesystem.EntryInfo, error) {
	argv := append([]string{"find", p}, args...)
	argv = append(argv, "-printf", entryFormat)
	out, _, err := f.s.run(ctx, id, argv...)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("path %s: no such file or directory", p))
		}
		return nil, connectErr(err)
	}
	var list []*filesystem.EntryInfo
	for _, rec := range strings.Split(out, "\x00") {
		if rec == "" {
			continue
		}
		e, err := parseEntry(rec)
		if err != nil {
			return nil, connect.NewError(connect.CodeInternal, err)
		}
		list = append(list, e)
	}
	if err := f.s.fillMetadata(ctx, id, list); err != nil {
		return nil, connectErr(err)
	}
	return list, nil
}

func parseEntry(rec string) (*filesystem.EntryInfo, error) {
	f := strings.SplitN(rec, "\t", 8)
	if len(f) != 8 {
		return nil, fmt.Errorf("unexpected find output %q", rec)
	}
	size, _ := strconv.ParseInt(f[1], 10, 64)
	mode, _ := strconv.ParseUint(f[2], 8, 32)
	secs, _ := strconv.ParseFloat(f[5], 64)
	whole, frac := math.Modf(secs)
	e := &filesystem.EntryInfo{Name: path.Base(f[7]), Path: f[7], Size: size, Mode: uint32(mode), Owner: f[3], Group: f[4],
		ModifiedTime: timestamppb.New(time.Unix(int64(whole), int64(frac*1e9)))}
	fm := fs.FileMode(mode) & fs.ModePerm
	switch f[0] {
	case "d":
		e.Type = filesystem.FileType_FILE_TYPE_DIRECTORY
		fm |= fs.ModeDir
	case "l":
		e.Type = filesystem.FileType_FILE_TYPE_SYMLINK
		fm |= fs.ModeSymlink
		// envd reports where the link points as an absolute path.
		t := f[6]
		if !path.IsAbs(t) {
			t = path.Join(path.Dir(f[7]), t)
		}
		t = path.Clean(t)
		e.SymlinkTarget = &t
	default:
		e.Type = filesystem.FileType_FILE_TYPE_FILE
	}
	e.Permissions = fm.String()
	return e, nil
}

// sortEntries orders a listing as envd's walk does: by name, a
// directory's entries right after it.
func sortEntries(list []*filesystem.EntryInfo) {
	slices.SortFunc(list, func(a, b *filesystem.EntryInfo) int {
		return slices.Compare(strings.Split(a.Path, "/"), strings.Split(b.Path, "/"))
	})
}

// fsUser is who a filesystem RPC runs as: the user its Authorization
// names, else DefaultUser (as files.write).
func (f *filesystemService) fsUser(ctx context.Context, h http.Header, id string) (string, error) {
	named, err := headerUser(h)
	if err != nil {
		return "", connect.NewError(connect.CodeInvalidArgument, err)
	}
	user, err := f.s.execUser(ctx, id, named)
	if err != nil {
		return "", connectErr(err)
	}
	return user, nil
}

// stat describes one path (absolute).
func (f *filesystemService) stat(ctx context.Context, id, p string) (*filesystem.EntryInfo, error) {
	list, err := f.entries(ctx, id, p, "-maxdepth", "0")
	if err != nil {
		return nil, err
	}
	if len(list) != 1 {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("stat %s: %d entries", p, len(list)))
	}
	return list[0], nil
}

func (f *filesystemService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	e, err := f.stat(ctx, sandboxID(req.Header()), resolve(req.Msg.GetPath()))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: e}), nil
}

func (f *filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	id, p := sandboxID(req.Header()), resolve(req.Msg.GetPath())
	depth := req.Msg.GetDepth()
	if depth == 0 {
		depth = 1
	}
	dir, err := f.stat(ctx, id, p)
	if err != nil {
		return nil, err
	}
	if dir.Type != filesystem.FileType_FILE_TYPE_DIRECTORY {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %s is not a directory", p))
	}
	list, err := f.entries(ctx, id, p, "-mindepth", "1", "-maxdepth", strconv.FormatUint(uint64(depth), 10))
	if err != nil {
		return nil, err
	}
	sortEntries(list)
	return connect.NewResponse(&filesystem.ListDirResponse{Entries: list}), nil
}

func (f *filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	id, p := sandboxID(req.Header()), resolve(req.Msg.GetPath())
	user, err := f.fsUser(ctx, req.Header(), id)
	if err != nil {
		return nil, err
	}
	// An existing path is AlreadyExists (the SDKs answer false), whatever
	// it is; anything else is made with its parents, as the user.
	_, _, err = f.s.runAs(ctx, id, user, "/bin/sh", "-c", `if [ -e "$1" ] || [ -L "$1" ]; then echo "$1: File exists" >&2; exit 1; fi; mkdir -p -- "$1"`, "sh", p)
	if err != nil {
		if errdefs.IsAlreadyExists(err) {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory %s already exists", p))
		}
		return nil, connectErr(err)
	}
	e, err := f.stat(ctx, id, p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: e}), nil
}

func (f *filesystemService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	id := sandboxID(req.Header())
	src, dst := resolve(req.Msg.GetSource()), resolve(req.Msg.GetDestination())
	user, err := f.fsUser(ctx, req.Header(), id)
	if err != nil {
		return nil, err
	}
	if _, _, err := f.s.runAs(ctx, id, user, "mv", "-T", "--", src, dst); err != nil {
		return nil, connectErr(err)
	}
	e, err := f.stat(ctx, id, dst)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: e}), nil
}

func (f *filesystemService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	id, p := sandboxID(req.Header()), resolve(req.Msg.GetPath())
	if p == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("refusing to remove /"))
	}
	user, err := f.fsUser(ctx, req.Header(), id)
	if err != nil {
		return nil, err
	}
	// A path that does not exist is removed already: envd answers that
	// with success too.
	if _, _, err := f.s.runAs(ctx, id, user, "rm", "-rf", "--", p); err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

var errNoWatch = errors.New("polling watchers (CreateWatcher) are not served by clade's E2B front: use the WatchDir stream (see docs/e2b.md)")

// maxWatchQueue bounds the events of one WatchDir between the sandbox's
// inotify and the client: past it the watch ends with an error rather
// than hold more.
const maxWatchQueue = 4096

// WatchDir streams changes under a directory by inotify in the sandbox
// (the agent's watch): create, write, remove, rename and chmod, named
// relative to it, from the moment the start event is sent. It runs until
// the client goes, its deadline passes or the directory is removed.
func (f *filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	id, p := sandboxID(req.Header()), resolve(req.Msg.GetPath())
	dir, err := f.stat(ctx, id, p)
	if err != nil {
		return err
	}
	if dir.Type != filesystem.FileType_FILE_TYPE_DIRECTORY {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %s is not a directory", p))
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := f.s.svc.Watch(ctx, id, service.Wake, p, req.Msg.GetRecursive())
	if err != nil {
		return connectErr(err)
	}
	defer w.Close()
	if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	events := make(chan service.WatchEvent, maxWatchQueue)
	failed := make(chan error, 1)
	go func() {
		defer close(events)
		for {
			ev, err := w.Next()
			if err != nil {
				failed <- err
				return
			}
			select {
			case events <- ev:
			default:
				failed <- connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("watch %s: more than %d events waiting for the client: it reads too slowly", p, maxWatchQueue))
				return
			}
		}
	}()
	var keep <-chan time.Time
	if every := keepaliveInterval(req.Header()); every > 0 {
		k := time.NewTicker(every)
		defer k.Stop()
		keep = k.C
	}
	for {
		select {
		case <-ctx.Done():
			return connectErr(ctx.Err())
		case <-keep:
			if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case ev, ok := <-events:
			if !ok {
				err := <-failed
				if errors.Is(err, io.EOF) || ctx.Err() != nil {
					return connectErr(ctx.Err())
				}
				return connectErr(err)
			}
			typ, known := eventTypes[ev.Op]
			if !known {
				continue
			}
			fe := &filesystem.FilesystemEvent{Name: ev.Name, Type: typ}
			if req.Msg.GetIncludeEntry() && typ != filesystem.EventType_EVENT_TYPE_REMOVE && typ != filesystem.EventType_EVENT_TYPE_RENAME {
				if e, err := f.stat(ctx, id, path.Join(p, ev.Name)); err == nil {
					fe.Entry = e
				}
			}
			if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: fe}}); err != nil {
				return err
			}
		}
	}
}

var eventTypes = map[string]filesystem.EventType{
	"create": filesystem.EventType_EVENT_TYPE_CREATE,
	"write":  filesystem.EventType_EVENT_TYPE_WRITE,
	"remove": filesystem.EventType_EVENT_TYPE_REMOVE,
	"rename": filesystem.EventType_EVENT_TYPE_RENAME,
	"chmod":  filesystem.EventType_EVENT_TYPE_CHMOD,
}

func (f *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errNoWatch)
}

func (f *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errNoWatch)
}

func (f *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errNoWatch)
}
