package mcp

import (
	"strings"
	"testing"
)

func TestCapped(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limit  int
		writes []string
		want   string
		cut    int64
	}{
		{"fits", 10, []string{"abc", "def"}, "abcdef", 0},
		{"exactly", 4, []string{"abcd"}, "abcd", 0},
		{"cut in one write", 4, []string{"abcdefgh"}, "ab\n[... 4 bytes cut ...]\ngh", 4},
		{"cut over many writes", 4, []string{"a", "b", "c", "d", "e", "f", "g"}, "ab\n[... 3 bytes cut ...]\nfg", 3},
		{"odd limit keeps more tail", 5, []string{"0123456789"}, "01\n[... 5 bytes cut ...]\n789", 5},
		{"whole runes kept", 6, []string{"aé" + strings.Repeat("x", 10) + "éb"}, "aé\n[... 10 bytes cut ...]\néb", 10},
		{"split runes dropped", 4, []string{"aé" + strings.Repeat("x", 4) + "éb"}, "a\n[... 6 bytes cut ...]\nb", 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCapped(tc.limit)
			for _, w := range tc.writes {
				if n, err := c.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", w, n, err)
				}
			}
			if got := c.String(); got != tc.want || c.cut() != tc.cut {
				t.Fatalf("got %q (cut %d), want %q (cut %d)", got, c.cut(), tc.want, tc.cut)
			}
		})
	}
}
