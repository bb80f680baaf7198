package dispatch

// Draining reports whether Drain has begun (tests wait on it instead of
// sleeping).
func (d *Dispatcher) Draining() bool { return d.draining.Load() }
