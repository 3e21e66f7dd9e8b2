package soak_test

import "testing"

// TestJudgeCounter checks the check's verdicts on a sandbox's counter,
// without a daemon: above all that a start cut short by a crash, whose
// counter the agent killed with its exec, is not counted lost, and that a
// counter known stopped is not taken for a running one at the next check.
func TestJudgeCounter(t *testing.T) {
	for _, tc := range []struct {
		name       string
		want, last int
		seen       string
		counter    int
		resolved   bool
		lost       bool
	}{
		{"running as acknowledged", 1, 10, "12 14", 1, false, false},
		{"acknowledged and stuck", 1, 10, "12 12", 0, false, true},
		{"acknowledged and gone", 1, 10, "none", 0, false, true},
		{"went back", 1, 50, "12 14", 1, false, true},
		{"start in flight: runs", 2, 0, "3 5", 1, true, false},
		{"start in flight: never ran", 2, 0, "none", 0, true, false},
		{"start in flight: killed with its exec", 2, 0, "1 1", 0, true, false},
		{"known stopped: stays stopped", 0, 1, "1 1", 0, false, false},
		{"known stopped, old state back", 0, 9, "1 1", 0, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := judgeCounter(tc.want, tc.last, tc.seen)
			if v.counter != tc.counter || v.resolved != tc.resolved || (v.lost != "") != tc.lost || v.unparsed {
				t.Fatalf("judgeCounter(%d, %d, %q) = %+v, want counter %d, resolved %v, lost %v",
					tc.want, tc.last, tc.seen, v, tc.counter, tc.resolved, tc.lost)
			}
		})
	}
	// The check that follows a stuck counter's verdict sees it stuck again:
	// still no loss (it used to flip to "runs" and be reported lost at the
	// check after).
	v := judgeCounter(2, 0, "1 1")
	for i := range 3 {
		v = judgeCounter(v.counter, v.lastCount, "1 1")
		if v.lost != "" || v.counter != 0 {
			t.Fatalf("check %d after a start cut short: %+v, want not running and nothing lost", i+2, v)
		}
	}
	if v := judgeCounter(1, 0, "COUNTER?"); !v.unparsed {
		t.Fatalf("unparsable output: %+v, want unparsed", v)
	}
}
