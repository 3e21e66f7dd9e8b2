package mcp

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/clade-sandbox/clade/sdk"
)

type ReadFileInput struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's id or name"`
	Path    string `json:"path" jsonschema:"absolute path of the file, e.g. /root/main.py"`
}

type ReadFileOutput struct {
	Path      string `json:"path"`
	Size      int64  `json:"size" jsonschema:"the file's whole size in bytes"`
	Encoding  string `json:"encoding" jsonschema:"'text' (content as is) or 'base64' (a binary file)"`
	Content   string `json:"content"`
	Truncated string `json:"truncated,omitempty" jsonschema:"set when only the start of the file is returned"`
}

type WriteFileInput struct {
	Sandbox  string `json:"sandbox" jsonschema:"the sandbox's id or name"`
	Path     string `json:"path" jsonschema:"absolute path of the file to create or replace, e.g. /root/main.py"`
	Content  string `json:"content" jsonschema:"the file's new content"`
	Encoding string `json:"encoding,omitempty" jsonschema:"'text' (the default) or 'base64' for binary content"`
	Mode     string `json:"mode,omitempty" jsonschema:"octal permissions, e.g. '755' for a script; default 644"`
}

type WriteFileOutput struct {
	Path string `json:"path"`
	Size int64  `json:"size" jsonschema:"bytes written"`
}

type ListFilesInput struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's id or name"`
	Path    string `json:"path" jsonschema:"absolute path of the directory, e.g. /root"`
	Depth   int    `json:"depth,omitempty" jsonschema:"how many levels to list: 1 (the default) lists the directory's own entries, at most 10"`
}

type FileEntry struct {
	Name     string `json:"name" jsonschema:"path relative to the listed directory"`
	Type     string `json:"type" jsonschema:"file, dir, symlink or other"`
	Size     int64  `json:"size"`
	Mode     string `json:"mode" jsonschema:"octal permissions"`
	Modified string `json:"modified" jsonschema:"modification time, RFC 3339"`
	Target   string `json:"target,omitempty" jsonschema:"a symlink's target"`
}

type ListFilesOutput struct {
	Path       string      `json:"path"`
	Entries    []FileEntry `json:"entries"`
	Truncated  string      `json:"truncated,omitempty" jsonschema:"set when there were more entries than returned"`
	Unreadable string      `json:"unreadable,omitempty" jsonschema:"set when some entries could not be read (e.g. /proc entries that vanished); the others are listed"`
}

// maxEntries bounds a listing's entries.
const maxEntries = 1000

func absPath(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("path %q is not absolute: give a path starting with /, e.g. /root/%s", p, p)
	}
	return path.Clean(p), nil
}

var errIsDir = errors.New("is a directory")

func (t *tools) readFile(ctx context.Context, in ReadFileInput) (*mcpsdk.CallToolResult, ReadFileOutput, error) {
	p, err := absPath(in.Path)
	if err != nil {
		return nil, ReadFileOutput{}, err
	}
	data, size, err := t.readUpTo(ctx, in.Sandbox, p, t.cfg.MaxFileBytes)
	if errors.Is(err, errIsDir) {
		return nil, ReadFileOutput{}, fmt.Errorf("%s is a directory: use list_files to see what it holds", p)
	}
	if err != nil {
		return nil, ReadFileOutput{}, err
	}
	out := ReadFileOutput{Path: p, Size: size, Encoding: "text"}
	if int64(len(data)) < size {
		out.Truncated = fmt.Sprintf("only the first %d of %d bytes are returned: read the rest with run_command (e.g. tail -c +%d %s | head -c %d)",
			len(data), size, len(data)+1, p, t.cfg.MaxFileBytes)
		data = trimPartialRune(data)
	}
	if isText(data) {
		out.Content = string(data)
	} else {
		out.Encoding, out.Content = "base64", base64.StdEncoding.EncodeToString(data)
	}
	return nil, out, nil
}

// readUpTo reads at most max bytes of the regular file at p, and its size.
func (t *tools) readUpTo(ctx context.Context, ref, p string, max int) ([]byte, int64, error) {
	rc, err := t.c.CopyFrom(ctx, ref, p)
	if err != nil {
		return nil, 0, err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	hdr, err := tr.Next()
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", p, err)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return nil, 0, errIsDir
	case tar.TypeSymlink:
		return nil, 0, fmt.Errorf("%s is a symbolic link to %s: read that path instead", p, hdr.Linkname)
	case tar.TypeReg:
	default:
		return nil, 0, fmt.Errorf("%s is not a regular file", p)
	}
	data, err := io.ReadAll(io.LimitReader(tr, int64(max)))
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", p, err)
	}
	return data, hdr.Size, nil
}

// isText reports whether b reads as text: valid UTF-8 without NUL bytes.
func isText(b []byte) bool { return utf8.Valid(b) && bytes.IndexByte(b, 0) < 0 }

// trimPartialRune drops an incomplete UTF-8 sequence that a cut left at
// the end of b.
func trimPartialRune(b []byte) []byte {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return b[:i]
			}
			break
		}
	}
	return b
}

func (t *tools) writeFile(ctx context.Context, in WriteFileInput) (*mcpsdk.CallToolResult, WriteFileOutput, error) {
	p, err := absPath(in.Path)
	if err != nil {
		return nil, WriteFileOutput{}, err
	}
	if p == "/" {
		return nil, WriteFileOutput{}, errors.New("path / is the root directory: give a file's path")
	}
	data := []byte(in.Content)
	switch in.Encoding {
	case "", "text":
	case "base64":
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return nil, WriteFileOutput{}, fmt.Errorf("content is not valid base64: %w", err)
		}
	default:
		return nil, WriteFileOutput{}, fmt.Errorf("encoding %q: use 'text' or 'base64'", in.Encoding)
	}
	mode := int64(0o644)
	if in.Mode != "" {
		m, err := strconv.ParseUint(in.Mode, 8, 32)
		if err != nil || m > 0o7777 {
			return nil, WriteFileOutput{}, fmt.Errorf("mode %q: give octal permissions such as 644 or 755", in.Mode)
		}
		mode = int64(m)
	}
	// The upload lands inside path if path is a directory: refuse that,
	// and make the parents the archive cannot.
	var stderr bytes.Buffer
	st, err := t.c.Exec(ctx, in.Sandbox, sdk.ExecRequest{Stderr: &stderr, Cmd: []string{"/bin/sh", "-c",
		`if [ -d "$1" ]; then echo "$1 is a directory: give a file's path" >&2; exit 1; fi; mkdir -p -- "$(dirname -- "$1")"`, "sh", p}})
	if err != nil {
		return nil, WriteFileOutput{}, err
	}
	if st.Code != 0 {
		return nil, WriteFileOutput{}, fmt.Errorf("write %s: %s", p, strings.TrimSpace(stderr.String()+" "+st.Error))
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: path.Base(p), Mode: mode, Size: int64(len(data)), ModTime: time.Now()}); err != nil {
		return nil, WriteFileOutput{}, err
	}
	if _, err := tw.Write(data); err != nil {
		return nil, WriteFileOutput{}, err
	}
	if err := tw.Close(); err != nil {
		return nil, WriteFileOutput{}, err
	}
	if err := t.c.CopyTo(ctx, in.Sandbox, p, &buf); err != nil {
		return nil, WriteFileOutput{}, err
	}
	return nil, WriteFileOutput{Path: p, Size: int64(len(data))}, nil
}

func (t *tools) listFiles(ctx context.Context, in ListFilesInput) (*mcpsdk.CallToolResult, ListFilesOutput, error) {
	p, err := absPath(in.Path)
	if err != nil {
		return nil, ListFilesOutput{}, err
	}
	depth := in.Depth
	switch {
	case depth == 0:
		depth = 1
	case depth < 0 || depth > 10:
		return nil, ListFilesOutput{}, fmt.Errorf("depth %d: give 1 to 10", depth)
	}
	entries, more, unreadable, err := t.list1(ctx, in.Sandbox, p, depth)
	if err != nil {
		return nil, ListFilesOutput{}, err
	}
	out := ListFilesOutput{Path: p, Entries: entries, Unreadable: unreadable}
	if more {
		out.Truncated = fmt.Sprintf("only the first %d entries are returned: list a subdirectory or a smaller depth", maxEntries)
	}
	return nil, out, nil
}

// list1 lists the directory p in the sandbox with find(1). Entries find
// could not read do not fail the listing (a find of /proc always meets
// some that vanished): unreadable says what they were.
func (t *tools) list1(ctx context.Context, ref, p string, depth int) (_ []FileEntry, more bool, unreadable string, _ error) {
	var stdout, stderr bytes.Buffer
	st, err := t.c.Exec(ctx, ref, sdk.ExecRequest{Stdout: &stdout, Stderr: &stderr, Timeout: time.Minute,
		Cmd: []string{"find", p + "/", "-mindepth", "1", "-maxdepth", strconv.Itoa(depth),
			"-printf", `%y\t%s\t%m\t%T@\t%l\t%P\0`}})
	if err != nil {
		return nil, false, "", err
	}
	// find exits 1 when it could not read some entries, after listing the
	// others; with nothing listed, p itself is the trouble.
	if st.Code != 0 && (st.Code != 1 || st.Error != "" || stdout.Len() == 0) {
		msg := strings.TrimSpace(stderr.String() + " " + st.Error)
		if strings.Contains(msg, "Not a directory") {
			msg = p + " is not a directory: use read_file for a file"
		}
		return nil, false, "", fmt.Errorf("list %s: %s", p, msg)
	}
	if st.Code != 0 {
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		unreadable = fmt.Sprintf("%d entries could not be read, e.g. %s", len(lines), lines[0])
	}
	entries := []FileEntry{}
	for rec := range strings.SplitSeq(stdout.String(), "\x00") {
		f := strings.SplitN(rec, "\t", 6)
		if len(f) != 6 {
			continue
		}
		if len(entries) == maxEntries {
			more = true
			break
		}
		e := FileEntry{Name: f[5], Mode: f[2], Target: f[4]}
		e.Size, _ = strconv.ParseInt(f[1], 10, 64)
		if sec, err := strconv.ParseFloat(f[3], 64); err == nil {
			e.Modified = time.Unix(int64(sec), 0).UTC().Format(time.RFC3339)
		}
		switch f[0] {
		case "f":
			e.Type = "file"
		case "d":
			e.Type = "dir"
		case "l":
			e.Type = "symlink"
		default:
			e.Type = "other"
		}
		entries = append(entries, e)
	}
	return entries, more, unreadable, nil
}

// fileTemplate names a file or directory in a sandbox as a resource.
const fileTemplate = "clade://sandboxes/{sandbox}/files{+path}"

func (t *tools) addResources(s *mcpsdk.Server) {
	s.AddResourceTemplate(&mcpsdk.ResourceTemplate{Name: "sandbox-file", Title: "A file in a sandbox",
		URITemplate: fileTemplate,
		Description: "A file or directory in a sandbox, e.g. clade://sandboxes/ID/files/etc/os-release; a directory reads as a listing, one entry a line."},
		t.readResource)
}

// readResource reads clade://sandboxes/ID/files/PATH.
func (t *tools) readResource(ctx context.Context, req *mcpsdk.ReadResourceRequest) (res *mcpsdk.ReadResourceResult, err error) {
	defer func() {
		if v := recover(); v != nil {
			res, err = nil, fmt.Errorf("internal error reading %s: %v", req.Params.URI, v)
		}
	}()
	uri := req.Params.URI
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != "clade" || u.Host != "sandboxes" {
		return nil, mcpsdk.ResourceNotFoundError(uri)
	}
	ref, p, ok := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/files")
	if !ok || ref == "" || !strings.HasPrefix(p+"/", "/") {
		return nil, mcpsdk.ResourceNotFoundError(uri)
	}
	if p == "" {
		p = "/"
	}
	p = path.Clean(p)
	data, _, err := t.readUpTo(ctx, ref, p, t.cfg.MaxFileBytes)
	if errors.Is(err, errIsDir) {
		entries, _, _, err := t.list1(ctx, ref, p, 1)
		if err != nil {
			return nil, err
		}
		var b strings.Builder
		for _, e := range entries {
			name := e.Name
			if e.Type == "dir" {
				name += "/"
			}
			fmt.Fprintf(&b, "%s\t%s\t%d\n", name, e.Type, e.Size)
		}
		return &mcpsdk.ReadResourceResult{Contents: []*mcpsdk.ResourceContents{{URI: uri, MIMEType: "text/plain", Text: b.String()}}}, nil
	}
	if sdk.IsNotFound(err) {
		return nil, mcpsdk.ResourceNotFoundError(uri)
	}
	if err != nil {
		return nil, err
	}
	c := &mcpsdk.ResourceContents{URI: uri}
	if isText(data) {
		c.MIMEType, c.Text = "text/plain", string(data)
		if t := mime.TypeByExtension(path.Ext(p)); strings.HasPrefix(t, "text/") || strings.Contains(t, "json") {
			c.MIMEType = t
		}
	} else {
		c.MIMEType, c.Blob = "application/octet-stream", data
	}
	return &mcpsdk.ReadResourceResult{Contents: []*mcpsdk.ResourceContents{c}}, nil
}
