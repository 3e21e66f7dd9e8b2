package hostmask

import "testing"

func TestCheckAndApply(t *testing.T) {
	for _, ok := range []string{"localhost:${PORT}", "masked.example", "127.0.0.1:8080", "${PORT}.example:${PORT}"} {
		if err := Check(ok); err != nil {
			t.Errorf("Check(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a b", "host/path", "user@host", "x?y", "a\r\nX-Injected: 1", string(make([]byte, 300))} {
		if err := Check(bad); err == nil {
			t.Errorf("Check(%.40q) passed", bad)
		}
	}
	if got := Apply("${PORT}.example:${PORT}", 3000); got != "3000.example:3000" {
		t.Errorf("Apply: %q", got)
	}
}
