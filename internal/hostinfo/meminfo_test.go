package hostinfo

import (
	"bytes"
	"os"
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

// TestFieldOf checks the one-line parser MemAvailableMiB uses against
// ParseMemInfo, on the test text and on this host's /proc/meminfo.
func TestFieldOf(t *testing.T) {
	const text = "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\nHugePages_Total:       0\nbogus line\nEmpty:\nBad: x kB\nLast: 4096 kB"
	for _, tt := range []struct {
		name    string
		wantMiB int64
		wantErr bool
	}{
		{"MemTotal", 24000, false},
		{"MemAvailable", 2, false},
		{"Last", 4, false},
		{"Empty", 0, true},
		{"Bad", 0, true},
		{"Mem", 0, true},
		{"SwapTotal", 0, true},
	} {
		got, err := fieldOf([]byte(text), tt.name)
		if (err != nil) != tt.wantErr || got != tt.wantMiB {
			t.Errorf("fieldOf(%s) = %d, %v; want %d, error %v", tt.name, got, err, tt.wantMiB, tt.wantErr)
		}
	}
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Skipf("no /proc/meminfo: %v", err)
	}
	m, err := ParseMemInfo(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"MemTotal", "SwapTotal", "Shmem"} {
		want, err := m.MiB(name)
		if err != nil {
			continue
		}
		if got, err := fieldOf(b, name); err != nil || got != want {
			t.Errorf("fieldOf(%s) = %d, %v; ParseMemInfo says %d", name, got, err, want)
		}
	}
}
