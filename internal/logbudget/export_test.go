package logbudget

import "time"

// SetClock replaces the budget's clock (tests).
func (b *Budget) SetClock(now func() time.Time) { b.now = now }

// SetFlushAfter replaces how long drops wait for their notice (tests); it
// returns a function that puts the old value back.
func SetFlushAfter(d time.Duration) (restore func()) {
	old := flushAfter
	flushAfter = d
	return func() { flushAfter = old }
}
