package hostinfo

import "testing"

func TestCPUTimes(t *testing.T) {
	busy, total := CPUTimes("cpu  100 5 50 800 45 0 0 0 0 0")
	if busy != 155 || total != 1000 {
		t.Fatalf("CPUTimes = %d, %d; want 155, 1000", busy, total)
	}
	// guest and guest_nice are inside user and nice already.
	if busy, total := CPUTimes("cpu  100 5 50 800 45 0 0 0 70 3"); busy != 155 || total != 1000 {
		t.Fatalf("CPUTimes with guest time = %d, %d; want 155, 1000", busy, total)
	}
	if busy, total := CPUTimes(""); busy != 0 || total != 0 {
		t.Fatalf("CPUTimes of nothing = %d, %d", busy, total)
	}
}

func TestReadCPUTimes(t *testing.T) {
	busy, total, err := ReadCPUTimes()
	if err != nil || total <= 0 || busy < 0 || busy > total {
		t.Fatalf("ReadCPUTimes = %d, %d, %v", busy, total, err)
	}
}
