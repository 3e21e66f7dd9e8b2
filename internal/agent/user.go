package agent

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// Bounds on reading the sandbox's account files: anything inside the
// sandbox may have written them.
const (
	maxAccountFile = 4 << 20 // bytes read of /etc/passwd or /etc/group
	maxAccountLine = 64 << 10
	maxGroups      = 64 // supplementary groups (NGROUPS_MAX is larger; no one needs more)
)

// account is a user an exec runs as, as the sandbox's /etc/passwd and
// /etc/group describe it.
type account struct {
	Name   string // empty for a uid the passwd file does not name
	UID    uint32
	GID    uint32
	Groups []uint32 // supplementary groups, from /etc/group
	Home   string
	Shell  string
}

// cred is the account's credential for a process.
func (u *account) cred() *syscall.Credential {
	return &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
}

// env is the login environment of the account (what login(1) sets).
func (u *account) env() []string {
	name := u.Name
	if name == "" {
		name = strconv.FormatUint(uint64(u.UID), 10)
	}
	env := []string{"USER=" + name, "LOGNAME=" + name}
	if u.Home != "" {
		env = append(env, "HOME="+u.Home)
	}
	if u.Shell != "" {
		env = append(env, "SHELL="+u.Shell)
	}
	return env
}

// resolveUser resolves spec — "name", "uid", "uid:gid" or "name:group" —
// against passwd and group files in dir (the sandbox's /etc). A name must
// be in the passwd file; a bare uid need not be (it then runs with gid =
// uid, or the given gid, home /). The error is InvalidArgument and says
// what is missing.
func resolveUser(dir, spec string) (*account, error) {
	if spec == "" || len(spec) > 256 {
		return nil, errdefs.New(errdefs.InvalidArgument, "user %.64q: give a user name or UID[:GID]", spec)
	}
	user, group, hasGroup := strings.Cut(spec, ":")
	if user == "" || (hasGroup && group == "") {
		return nil, errdefs.New(errdefs.InvalidArgument, "user %q: give a user name or UID[:GID]", spec)
	}
	num, numErr := strconv.ParseUint(user, 10, 32)
	var u *account
	scanAccounts(filepath.Join(dir, "passwd"), func(f []string) bool {
		// name:password:uid:gid:gecos:home:shell
		if len(f) < 7 {
			return false
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			return false
		}
		if f[0] != user && (numErr != nil || uid != num) {
			return false
		}
		u = &account{Name: f[0], UID: uint32(uid), GID: uint32(gid), Home: f[5], Shell: f[6]}
		return true
	})
	if u == nil {
		if numErr != nil {
			return nil, errdefs.New(errdefs.InvalidArgument, "user %q not found in the sandbox's /etc/passwd: create it (useradd) or give a UID", user)
		}
		u = &account{UID: uint32(num), GID: uint32(num), Home: "/"}
	}
	if hasGroup {
		gnum, gErr := strconv.ParseUint(group, 10, 32)
		found := false
		scanAccounts(filepath.Join(dir, "group"), func(f []string) bool {
			if len(f) < 3 {
				return false
			}
			gid, err := strconv.ParseUint(f[2], 10, 32)
			if err != nil || (f[0] != group && (gErr != nil || gid != gnum)) {
				return false
			}
			u.GID, found = uint32(gid), true
			return true
		})
		if !found {
			if gErr != nil {
				return nil, errdefs.New(errdefs.InvalidArgument, "group %q not found in the sandbox's /etc/group: create it (groupadd) or give a GID", group)
			}
			u.GID = uint32(gnum)
		}
	}
	if u.Name != "" {
		u.Groups = supplementaryGroups(filepath.Join(dir, "group"), u.Name, u.GID)
	}
	return u, nil
}

// supplementaryGroups lists the groups of file whose member list names
// user, the primary group gid first (as initgroups(3) does).
func supplementaryGroups(file, user string, gid uint32) []uint32 {
	groups := []uint32{gid}
	scanAccounts(file, func(f []string) bool {
		// name:password:gid:member,member
		if len(f) < 4 || f[3] == "" {
			return false
		}
		g, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil || uint32(g) == gid {
			return false
		}
		for _, m := range strings.Split(f[3], ",") {
			if m == user {
				groups = append(groups, uint32(g))
				break
			}
		}
		return len(groups) >= maxGroups
	})
	return groups
}

// scanAccounts calls fn with the colon-separated fields of each line of
// file until fn returns true. It reads at most maxAccountFile bytes and
// skips comments, blank lines, over-long lines and NIS "+"/"-" entries. A
// missing or unreadable file has no lines.
func scanAccounts(file string, fn func(fields []string) bool) {
	// O_NONBLOCK: opening a FIFO planted there would block until a
	// writer came; it, a device or a socket is then refused.
	f, err := os.OpenFile(file, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return
	}
	br := bufio.NewReaderSize(io.LimitReader(f, maxAccountFile), 4096)
	for {
		line, err := readLine(br)
		if line != "" && line[0] != '#' && line[0] != '+' && line[0] != '-' {
			if fn(strings.Split(line, ":")) {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// readLine returns the next line of br without its newline; a line over
// maxAccountLine is skipped whole (returned empty).
func readLine(br *bufio.Reader) (string, error) {
	var b []byte
	long := false
	for {
		chunk, err := br.ReadSlice('\n')
		if !long {
			if len(b)+len(chunk) > maxAccountLine {
				long, b = true, nil
			} else {
				b = append(b, chunk...)
			}
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if long {
			return "", err
		}
		return strings.TrimRight(string(b), "\r\n"), err
	}
}

// userDir returns the directory an exec as u starts in when none is
// given: u's home if it is a directory, else "".
func userDir(u *account) string {
	if u.Home == "" || !filepath.IsAbs(u.Home) {
		return ""
	}
	if fi, err := os.Stat(u.Home); err == nil && fi.IsDir() {
		return u.Home
	}
	return ""
}
