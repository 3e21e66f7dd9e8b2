package hostinfo

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// CPUTimes parses a /proc/stat cpu line ("cpu  user nice system idle
// iowait irq softirq steal guest guest_nice") into busy and total
// jiffies. Guest time is already in user and nice, so it is not counted
// again.
func CPUTimes(line string) (busy, total int64) {
	f := strings.Fields(line)
	for i, v := range f[min(1, len(f)):] {
		if i >= 8 { // guest, guest_nice
			break
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total
}

// ReadCPUTimes returns the whole host's busy and total jiffies since boot
// (the first line of /proc/stat).
func ReadCPUTimes() (busy, total int64, err error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, 0, sc.Err()
	}
	busy, total = CPUTimes(sc.Text())
	return busy, total, nil
}
