package main

import (
	"maps"
	"testing"

	"github.com/clade-sandbox/clade/internal/sandbox"
)

// TestHotPoolFlag: --hot-pool takes the old N (the default image's) and
// a list per image, and refuses negative counts and bad names.
func TestHotPoolFlag(t *testing.T) {
	for _, tc := range []struct {
		in   string
		def  int
		imgs map[string]int
		bad  bool
	}{
		{in: "4", def: 4, imgs: map[string]int{}},
		{in: "0", def: 0, imgs: map[string]int{}},
		{in: "default=4,e2b-base=2", def: 4, imgs: map[string]int{"e2b-base": 2}},
		{in: "e2b-base=1", def: 2, imgs: map[string]int{"e2b-base": 1}},
		{in: "3, e2b-base=0", def: 3, imgs: map[string]int{"e2b-base": 0}},
		{in: "-1", bad: true},
		{in: "default=-1", bad: true},
		{in: "e2b-base=x", bad: true},
		{in: "../x=1", bad: true},
		{in: "=1", bad: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			c := sandbox.Config{HotPool: 2}
			err := hotPoolFlag{&c}.Set(tc.in)
			if tc.bad {
				if err == nil {
					t.Fatalf("accepted: %d %v", c.HotPool, c.HotImages)
				}
				return
			}
			if err != nil || c.HotPool != tc.def || !maps.Equal(c.HotImages, tc.imgs) {
				t.Fatalf("got %d %v %v, want %d %v", c.HotPool, c.HotImages, err, tc.def, tc.imgs)
			}
			if s := (hotPoolFlag{&c}).String(); s == "" {
				t.Fatal("no String")
			}
		})
	}
}
