package api

import "testing"

// TestPositions: String and ParsePositions agree; malformed positions are
// refused, never read as something else.
func TestPositions(t *testing.T) {
	p := Positions{"n2": 7, "n1": 1733480000000123, "a.b_c-d": 0}
	s := p.String()
	if s != "a.b_c-d:0,n1:1733480000000123,n2:7" {
		t.Fatalf("String: %q", s)
	}
	back, err := ParsePositions(s)
	if err != nil || len(back) != 3 || back["n1"] != 1733480000000123 || back["n2"] != 7 {
		t.Fatalf("ParsePositions(%q): %v %v", s, back, err)
	}
	if p, err := ParsePositions(""); err != nil || len(p) != 0 {
		t.Fatalf("empty: %v %v", p, err)
	}
	for _, bad := range []string{"n1", ":5", "n1:", "n1:-1", "n1:x", "n1:5,", "n1:5,n1:6", "n1:5;n2:6", "n1:18446744073709551616"} {
		if p, err := ParsePositions(bad); err == nil {
			t.Errorf("ParsePositions(%q) = %v, want an error", bad, p)
		}
	}
}
