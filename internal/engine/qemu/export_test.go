package qemu

import "time"

// SetHelloWait sets how long a restored VM's link waits for its agent's
// first hello (TestForkLevers compares settings).
func (e *Engine) SetHelloWait(d time.Duration) { e.helloWait = d }
