package python

import "github.com/virtufin/workmanager/engines"

// BatchedCalls is how many of inst's calls went in a batch of two or more.
func BatchedCalls(inst engines.Instance) int64 { return inst.(*Instance).batched.Load() }

// Waiting is how many of inst's calls wait for a process.
func Waiting(inst engines.Instance) int {
	in := inst.(*Instance)
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.waiting)
}

// AllExited reports whether every runner process inst holds has exited
// and been seen to (its Done closed).
func AllExited(inst engines.Instance) bool { return inst.(*Instance).pool.AllExited() }
