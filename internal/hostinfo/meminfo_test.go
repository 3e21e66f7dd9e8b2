package hostinfo

import (
	"strings"
	"testing"
)

func TestParseMemInfo(t *testing.T) {
	const text = "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\nHugePages_Total:       0\nbogus line\nEmpty:\n"
	m, err := ParseMemInfo(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		wantMiB int64
		wantErr bool
	}{
		{"MemTotal", 24000, false},
		{"MemAvailable", 2, false},
		{"HugePages_Total", 0, false},
		{"Empty", 0, true},
		{"SwapTotal", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := m.MiB(tt.name)
			if (err != nil) != tt.wantErr || got != tt.wantMiB {
				t.Fatalf("MiB(%s) = %d, %v; want %d, error %v", tt.name, got, err, tt.wantMiB, tt.wantErr)
			}
		})
	}
}

func TestReadMemInfo(t *testing.T) {
	total, err := MemTotalMiB()
	if err != nil {
		t.Skipf("no /proc/meminfo: %v", err)
	}
	avail, err := MemAvailableMiB()
	if err != nil {
		t.Fatal(err)
	}
	if total <= 0 || avail <= 0 || avail > total {
		t.Fatalf("MemTotal %d MiB, MemAvailable %d MiB", total, avail)
	}
}
