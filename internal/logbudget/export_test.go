package logbudget

import "time"

// SetClock replaces the budget's clock (tests).
func (b *Budget) SetClock(now func() time.Time) { b.now = now }
