package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/clade-sandbox/clade/internal/errdefs"
)

// A Recipe builds a built-in image offline, from Debian's packages only
// (debootstrap; no registry is needed), once per image directory.
type Recipe struct {
	Name string
	// About says in a line what the image holds, for logs and docs.
	About string
	// Include lists the packages debootstrap installs beyond its minbase
	// variant (their dependencies come with them).
	Include []string
	// Apt lists packages apt-get installs into the root after debootstrap,
	// for those whose dependencies debootstrap's own resolver cannot
	// follow (alternatives, virtual packages: npm's, for one).
	Apt []string
	// Post, if set, finishes the root filesystem after debootstrap (users,
	// configuration files, programs of clade's own). It runs on the host
	// with rootfs the image's root: every path it writes must stay under
	// it.
	Post func(ctx context.Context, rootfs string) error
	// Warm, if set, is a shell command (/bin/sh -c) run in every hot-pool
	// sandbox of the image after its start, before a create may claim it:
	// what the image's first use would otherwise wait for (the code
	// interpreter's server and its Python kernel). A sandbox whose warm
	// step fails is destroyed, never handed out.
	Warm string
	// WarmStdin, if set, is written to the warm step's stdin (then
	// closed): what the daemon delivers into the sandbox, such as the
	// code interpreter's server of this clade, newer than the image's.
	WarmStdin []byte
}

// WarmCommand returns the warm step of the built-in image name (Recipe.Warm),
// or "" when it has none.
func WarmCommand(name string) string {
	return recipes[name].Warm
}

// WarmStdin returns what the warm step of the built-in image name reads on
// its stdin (Recipe.WarmStdin), or nil.
func WarmStdin(name string) []byte {
	return recipes[name].WarmStdin
}

// Source is what the image records as where it came from.
func (r Recipe) Source(mirror string) string {
	src := "debootstrap --variant=minbase --include=" + strings.Join(r.Include, ",") + " bookworm " + mirror
	if len(r.Apt) > 0 {
		src += " + apt-get install " + strings.Join(r.Apt, " ")
	}
	return src
}

var recipes = map[string]Recipe{
	Default: {Name: Default, About: "debootstrap minbase bookworm + python3", Include: []string{"python3"}},
}

// RegisterRecipe adds a built-in image. It is meant for package init
// functions; a second recipe of one name panics.
func RegisterRecipe(r Recipe) {
	if !ValidName(r.Name) || len(r.Include) == 0 {
		panic("image: bad recipe " + r.Name)
	}
	if _, dup := recipes[r.Name]; dup {
		panic("image: recipe " + r.Name + " registered twice")
	}
	recipes[r.Name] = r
}

// Builtin returns the recipe of the built-in image name.
func Builtin(name string) (Recipe, bool) {
	r, ok := recipes[name]
	return r, ok
}

// Builtins lists the built-in images' names, sorted.
func Builtins() []string {
	out := make([]string, 0, len(recipes))
	for n := range recipes {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func isBuiltinBuild(entry string) bool {
	_, ok := recipes[strings.TrimPrefix(entry, buildPrefix)]
	return ok
}

// Built reports whether the built-in image name is in the directory.
func (s *Store) Built(name string) bool {
	_, err := s.descriptor(name)
	return err == nil
}

// EnsureBuiltin builds the built-in image name if it is missing. It holds
// a lock so that concurrent daemons sharing the directory build it once,
// and builds in a directory that is renamed into place only when complete,
// so that an interrupted build never shows as an image.
func (s *Store) EnsureBuiltin(ctx context.Context, name string) error {
	r, ok := recipes[name]
	if !ok {
		return errdefs.New(errdefs.NotFound, "no built-in image %q: the built-in images are %s", name, strings.Join(Builtins(), ", "))
	}
	if s.Built(name) {
		return nil
	}
	lock, err := os.OpenFile(filepath.Join(s.dir, "."+name+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if s.Built(name) {
		return nil // another process built it while we waited
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return fmt.Errorf("debootstrap not found: run `make deps` (apt-get install debootstrap) to build the %s image", name)
	}
	start := time.Now()
	s.log.Info("building the "+name+" image ("+r.About+"); this takes a few minutes once", "dir", s.dir)
	build := filepath.Join(s.dir, buildPrefix+name)
	_ = os.RemoveAll(build) // a build a killed daemon left half done
	if err := os.MkdirAll(build, 0o755); err != nil {
		return err
	}
	rootfs := filepath.Join(build, "rootfs")
	logf, err := os.Create(filepath.Join(build, "debootstrap.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	if err := s.runRecipe(ctx, r, rootfs, logf); err != nil {
		// The build directory goes at the next attempt: its log is kept
		// beside the images, the last failed build's, for the user.
		kept := s.FailedBuildLog(name)
		fmt.Fprintf(logf, "\nclade: the build of the %s image failed: %v\n", name, err)
		if cerr := copyFile(logf.Name(), kept); cerr != nil {
			return fmt.Errorf("%w (its log could not be kept: %v)", err, cerr)
		}
		return fmt.Errorf("%w (log in %s)", err, kept)
	}
	_ = os.Remove(s.FailedBuildLog(name))
	// Package caches are not part of the image.
	for _, p := range []string{"var/cache/apt/archives", "var/lib/apt/lists"} {
		ents, _ := os.ReadDir(filepath.Join(rootfs, p))
		for _, e := range ents {
			if e.Name() != "partial" && e.Name() != "lock" {
				_ = os.RemoveAll(filepath.Join(rootfs, p, e.Name()))
			}
		}
	}
	if err := addMountPoints(rootfs); err != nil {
		return err
	}
	img := Image{Name: name, Source: r.Source(s.Mirror), CreatedAt: time.Now().UTC(), SizeBytes: DirSize(rootfs)}
	b, _ := json.MarshalIndent(img, "", "  ")
	if err := os.WriteFile(filepath.Join(build, "image.json"), b, 0o644); err != nil {
		return err
	}
	final := filepath.Join(s.dir, name)
	if err := os.RemoveAll(final); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.Rename(build, final); err != nil {
		return err
	}
	s.log.Info(name+" image built", "took", time.Since(start).Round(time.Second), "size_mib", img.SizeBytes>>20)
	return nil
}

// FailedBuildLog is where the log of the last failed build of the
// built-in image name is kept (removed once a build succeeds).
func (s *Store) FailedBuildLog(name string) string {
	return filepath.Join(s.dir, "."+name+".failed-build.log")
}

// runRecipe runs r's debootstrap, apt-get and post step into rootfs,
// logging to logf.
func (s *Store) runRecipe(ctx context.Context, r Recipe, rootfs string, logf *os.File) error {
	deboot, err := exec.LookPath("debootstrap")
	if err != nil {
		return fmt.Errorf("debootstrap not found: run `make deps` (apt-get install debootstrap) to build the %s image", r.Name)
	}
	cmd := exec.CommandContext(ctx, deboot, "--variant=minbase", "--include="+strings.Join(r.Include, ","), "bookworm", rootfs, s.Mirror)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("debootstrap of the %s image failed: %w", r.Name, err)
	}
	if len(r.Apt) > 0 {
		if err := aptInstall(ctx, rootfs, r.Apt, logf); err != nil {
			return fmt.Errorf("installing the %s image's packages: %w", r.Name, err)
		}
	}
	if r.Post != nil {
		if err := r.Post(ctx, rootfs); err != nil {
			return fmt.Errorf("finishing the %s image: %w", r.Name, err)
		}
	}
	return nil
}

// copyFile copies src to dst (replaced whole: written aside, renamed).
func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// aptInstall installs pkgs into rootfs with the root's own apt-get, in a
// chroot: name lookups through the host's resolv.conf (put back after),
// no service started (policy-rc.d), nothing mounted.
func aptInstall(ctx context.Context, rootfs string, pkgs []string, logf *os.File) error {
	resolv := filepath.Join(rootfs, "etc", "resolv.conf")
	if fi, err := os.Lstat(resolv); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		return errors.New("the root's /etc/resolv.conf is a symbolic link")
	}
	old, oldErr := os.ReadFile(resolv)
	host, err := os.ReadFile("/etc/resolv.conf")
	if err != nil {
		return err
	}
	if err := os.WriteFile(resolv, host, 0o644); err != nil {
		return err
	}
	defer func() {
		if oldErr == nil {
			_ = os.WriteFile(resolv, old, 0o644)
		} else {
			_ = os.Remove(resolv)
		}
	}()
	policy := filepath.Join(rootfs, "usr", "sbin", "policy-rc.d")
	if err := os.WriteFile(policy, []byte("#!/bin/sh\nexit 101\n"), 0o755); err != nil {
		return err
	}
	defer os.Remove(policy)
	run := func(args ...string) error {
		cmd := exec.CommandContext(ctx, "chroot", append([]string{rootfs}, args...)...)
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C"}
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.WaitDelay = 10 * time.Second
		return cmd.Run()
	}
	if err := run("apt-get", "update", "-qq"); err != nil {
		return err
	}
	return run(append([]string{"apt-get", "install", "-y", "-qq", "--no-install-recommends"}, pkgs...)...)
}
