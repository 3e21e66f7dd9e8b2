package main

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/clade-sandbox/clade/internal/image"
	"github.com/clade-sandbox/clade/internal/sandbox"
)

// hotPoolFlag is --hot-pool: N (sandboxes of the default image, as before)
// or a list IMAGE=N,... in which `default` names the default image (a bare
// N in the list is the default image's too).
type hotPoolFlag struct{ c *sandbox.Config }

func (f hotPoolFlag) String() string {
	if f.c == nil {
		return ""
	}
	if len(f.c.HotImages) == 0 {
		return strconv.Itoa(f.c.HotPool)
	}
	parts := []string{image.Default + "=" + strconv.Itoa(f.c.HotPool)}
	for _, name := range slices.Sorted(maps.Keys(f.c.HotImages)) {
		parts = append(parts, name+"="+strconv.Itoa(f.c.HotImages[name]))
	}
	return strings.Join(parts, ",")
}

func (f hotPoolFlag) Type() string { return "N|IMAGE=N,..." }

func (f hotPoolFlag) Set(v string) error {
	def, imgs := f.c.HotPool, map[string]int{}
	for _, part := range strings.Split(v, ",") {
		name, num, named := strings.Cut(strings.TrimSpace(part), "=")
		if !named {
			name, num = image.Default, name
		}
		n, err := strconv.Atoi(num)
		if err != nil || n < 0 {
			return fmt.Errorf("bad count %q: give N or IMAGE=N,... with N 0 or more (e.g. default=2,e2b-base=2)", part)
		}
		if !image.ValidName(name) {
			return fmt.Errorf("bad image name %q: give the image's name as `clade image ls` shows it", name)
		}
		if name == image.Default {
			def = n
			continue
		}
		imgs[name] = n
	}
	f.c.HotPool = def
	f.c.HotImages = imgs
	return nil
}
