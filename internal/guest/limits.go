package guest

import (
	"strings"

	"github.com/clade-sandbox/clade/internal/agent/wire"
	"github.com/clade-sandbox/clade/internal/errdefs"
)

// Limits on what an exec carries, chosen so that an exec the host accepts
// can never fail in execve with E2BIG or ENAMETOOLONG: Linux and gVisor
// refuse a single string over 128 KiB and argv plus environment over 2 MiB.
// A sandbox's environment (image, sandbox and exec entries together) and an
// exec's argv stay well under that.
const (
	// MaxEnvEntry bounds one KEY=VALUE entry, in bytes.
	MaxEnvEntry = 32 << 10
	// MaxEnvTotal bounds the entries of one list (a sandbox's env, an
	// exec's env), in bytes.
	MaxEnvTotal = 256 << 10
	// MaxArg bounds one argument of an exec, in bytes (the kernel's own
	// limit, less its NUL).
	MaxArg = 128<<10 - 1
	// MaxArgvTotal bounds an exec's arguments, in bytes.
	MaxArgvTotal = 512 << 10
)

// CheckEnv checks a list of KEY=VALUE entries: each well formed, none over
// MaxEnvEntry, all together under MaxEnvTotal. It returns an
// InvalidArgument error naming the limit.
func CheckEnv(env []string) error {
	total := 0
	for _, kv := range env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.Contains(kv, "\x00") {
			return errdefs.New(errdefs.InvalidArgument, "bad environment variable %q: use KEY=VALUE", short(kv))
		}
		if len(kv) > MaxEnvEntry {
			return errdefs.New(errdefs.InvalidArgument, "environment variable %s is %d bytes, over the limit of %d bytes per entry: pass large data as a file (clade cp) instead", short(k), len(kv), MaxEnvEntry)
		}
		total += len(kv) + 1
	}
	if total > MaxEnvTotal {
		return errdefs.New(errdefs.InvalidArgument, "the environment is %d bytes, over the limit of %d bytes in all: pass large data as a file (clade cp) instead", total, MaxEnvTotal)
	}
	return nil
}

// CheckArgv checks an exec's arguments against MaxArg per argument and
// MaxArgvTotal in all. It returns an InvalidArgument error naming the limit.
func CheckArgv(argv []string) error {
	total := 0
	for i, a := range argv {
		if strings.Contains(a, "\x00") {
			return errdefs.New(errdefs.InvalidArgument, "argument %d contains a NUL byte", i)
		}
		if len(a) > MaxArg {
			return errdefs.New(errdefs.InvalidArgument, "argument %d is %d bytes, over the limit of %d bytes per argument: pass large data on stdin or as a file", i, len(a), MaxArg)
		}
		total += len(a) + 1
	}
	if total > MaxArgvTotal {
		return errdefs.New(errdefs.InvalidArgument, "the arguments are %d bytes, over the limit of %d bytes in all: pass large data on stdin or as a file", total, MaxArgvTotal)
	}
	return nil
}

// MergeEnv joins KEY=VALUE lists as the agent does for an exec: a later
// value of a key replaces an earlier one in its place.
func MergeEnv(lists ...[]string) []string { return wire.MergeEnv(lists...) }

// short cuts s for an error message.
func short(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
