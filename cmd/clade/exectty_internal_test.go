package main

import (
	"flag"
	"slices"
	"testing"
)

func TestExpandShortFlags(t *testing.T) {
	for _, tc := range []struct {
		in, want []string
	}{
		{[]string{"-it", "ID", "--", "bash"}, []string{"-i", "-t", "ID", "--", "bash"}},
		{[]string{"-ti", "ID", "bash"}, []string{"-t", "-i", "ID", "bash"}},
		{[]string{"-i", "-t", "ID"}, []string{"-i", "-t", "ID"}},
		{[]string{"--env", "A=1", "-it", "ID"}, []string{"--env", "A=1", "-i", "-t", "ID"}},
		// Only flags before the sandbox are touched, and only i/t runs.
		{[]string{"-it", "ID", "--", "ls", "-it"}, []string{"-i", "-t", "ID", "--", "ls", "-it"}},
		{[]string{"ID", "-it"}, []string{"ID", "-it"}},
		{[]string{"-ix", "ID"}, []string{"-ix", "ID"}},
		{[]string{"-workdir", "/tmp", "ID"}, []string{"-workdir", "/tmp", "ID"}},
		{[]string{"--timeout", "-5s", "-it", "ID"}, []string{"--timeout", "-5s", "-i", "-t", "ID"}},
		{[]string{"-timeout=5s", "-ti", "ID"}, []string{"-timeout=5s", "-t", "-i", "ID"}},
	} {
		fs := flag.NewFlagSet("exec", flag.ContinueOnError)
		fs.Bool("i", false, "")
		fs.Bool("t", false, "")
		fs.String("env", "", "")
		fs.String("workdir", "", "")
		fs.Duration("timeout", 0, "")
		if got := expandShortFlags(fs, tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("expandShortFlags(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
