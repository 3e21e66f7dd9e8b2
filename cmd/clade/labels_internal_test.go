package main

import (
	"strings"
	"testing"
)

// TestParseLabelsTwoValues: --label a=1 --label a=2 is refused, not read
// as a=2 (as an ls or sleep filter that matched what a=1 excluded).
func TestParseLabelsTwoValues(t *testing.T) {
	if _, err := parseLabels([]string{"a=1", "a=2"}); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("parseLabels(a=1, a=2) = %v; want a usage error", err)
	}
	got, err := parseLabels([]string{"a=1", "a=1", "b="})
	if err != nil || len(got) != 2 || got["a"] != "1" || got["b"] != "" {
		t.Fatalf("parseLabels(a=1, a=1, b=) = %v, %v", got, err)
	}
}
