package qemu

import (
	"context"
	"time"
)

// SetHelloWait sets how long a restored VM's link waits for its agent's
// first hello (TestForkLevers compares settings).
func (e *Engine) SetHelloWait(d time.Duration) { e.helloWait = d }

// SetNudge turns the links' wire.Nudge on or off (TestForkLevers compares).
func (e *Engine) SetNudge(on bool) { e.noNudge = !on }

// SetTHP starts QEMU directly (THP as the host has it) or through the
// no-THP launcher (TestForkLevers compares).
func (e *Engine) SetTHP(on bool) { e.keepTHP = on }

// Warm does what an engine does once before its first VM (the initramfs,
// the accelerator probe) and builds rootfs's disk image, so that a timing
// that starts after it sees what a long-running daemon's engine does.
func (e *Engine) Warm(ctx context.Context, rootfs string) error {
	if err := e.setup(); err != nil {
		return err
	}
	_, err := e.rootImage(ctx, rootfs)
	return err
}
