package devstack

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/virtufin/workmanager/engines/crashjournal"
)

// Restart backoff of a supervised process, as Kubernetes restarts a
// container: RestartBase after the first exit, doubling to RestartMax, and
// back to RestartBase once a run lasted RestartReset.
const (
	RestartBase  = time.Second
	RestartMax   = 30 * time.Second
	RestartReset = time.Minute
)

// Supervisor keeps one process running: when it exits it is started again
// after a backoff, each restart reported (never a silent loop). It is how
// `make run` keeps its node: a node that dies (a native worker that crashes
// it in process) costs a restart, not the stack.
type Supervisor struct {
	// Name names the process in reports.
	Name string
	// Start starts the process.
	Start func() (*Proc, error)
	// Say prints one report line.
	Say func(string)
	// JournalDir, when set, is the process's crash journal directory
	// (NODE_STATE_DIR): a report names the worker and event the process
	// was running in native code when it died.
	JournalDir string
	// Base, Max and Reset override RestartBase, RestartMax, RestartReset.
	Base, Max, Reset time.Duration

	mu       sync.Mutex
	cur      *Proc
	restarts int
	changed  chan struct{} // closed and replaced at each start
}

// Current is the process running now (nil before the first start or
// while a restart waits).
func (s *Supervisor) Current() *Proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// Restarts is how many times the process was started again.
func (s *Supervisor) Restarts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.restarts
}

// Started returns a channel closed at the next start.
func (s *Supervisor) Started() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.changed
}

func (s *Supervisor) set(p *Proc, restart bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur = p
	if restart && p != nil {
		s.restarts++
	}
	if p != nil && s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
}

// Run starts the process and keeps it running until ctx ends; then it
// stops the running one with stop and returns. The first start's error is
// returned at once (nothing ran); later failed starts are retried.
func (s *Supervisor) Run(ctx context.Context, stop func(*Proc)) error {
	base, max, reset := s.Base, s.Max, s.Reset
	if base <= 0 {
		base = RestartBase
	}
	if max <= 0 {
		max = RestartMax
	}
	if reset <= 0 {
		reset = RestartReset
	}
	p, err := s.Start()
	if err != nil {
		return err
	}
	s.set(p, false)
	wait := base
	started := time.Now()
	for {
		select {
		case <-ctx.Done():
			stop(p)
			return nil
		case <-p.Done():
		}
		if time.Since(started) >= reset {
			wait = base // it had been up a while: not a crash loop
		}
		s.set(nil, false)
		s.Say(s.report(p, wait))
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
			wait = min(2*wait, max)
			np, err := s.Start()
			if err == nil {
				p = np
				break
			}
			s.Say(fmt.Sprintf("%s not restarted: %v; trying again in %s", s.Name, err, wait))
		}
		started = time.Now()
		s.set(p, true)
	}
}

// report is the line printed when p exited: why, what it was running in
// native code (the crash journal), when it restarts, where its log is.
func (s *Supervisor) report(p *Proc, wait time.Duration) string {
	why := "exited"
	if p.err != nil {
		why = "exited (" + p.err.Error() + ")"
	}
	if s.JournalDir != "" {
		if r := crashjournal.CrashReport(s.JournalDir); r != "" && p.err != nil {
			why = "exited (" + p.err.Error() + ": " + r + ")"
		}
	}
	line := fmt.Sprintf("%s %s", s.Name, why)
	if s.JournalDir != "" {
		if calls, err := crashjournal.Peek(s.JournalDir); err == nil && len(calls) > 0 {
			line += " while running in native code: " + crashjournal.Describe(calls) + " (crash journal)"
		}
	}
	return fmt.Sprintf("%s; restarting it in %s (restart %d); its log: %s", line, wait, s.Restarts()+1, p.Log)
}
