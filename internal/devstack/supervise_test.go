package devstack

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines/crashjournal"
)

// Issue 44 item 1: a supervised process (make run's node) that dies is
// started again, with backoff, each restart reported with what the crash
// journal says it was running; stopping the supervisor stops it.
func TestSupervisorRestartsTheProcessThatDies(t *testing.T) {
	dir := t.TempDir()
	jdir := t.TempDir()
	j, _, err := crashjournal.Open(jdir, crashjournal.Options{Slots: 4})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := j.Acquire()
	j.Enter(s, "bad-worker", "src", "poison-event") // in flight, never left: as a crash leaves it
	var mu sync.Mutex
	var lines []string
	sup := &Supervisor{Name: "worker node", JournalDir: jdir, Base: 10 * time.Millisecond, Max: 40 * time.Millisecond,
		Start: func() (*Proc, error) { return StartProc(dir, "node", nil, "/bin/sh", "-c", "exit 3") },
		Say: func(l string) {
			mu.Lock()
			lines = append(lines, l)
			mu.Unlock()
		}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx, func(p *Proc) { p.Stop(time.Second) }) }()
	deadline := time.After(30 * time.Second)
	for sup.Restarts() < 3 {
		select {
		case <-deadline:
			t.Fatalf("restarted %d times in 30 s, want 3", sup.Restarts())
		case <-time.After(10 * time.Millisecond):
		}
	}
	// Now a process that stays up: the supervisor stops it on the way out.
	j.Leave(s)
	j.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lines) < 3 {
		t.Fatalf("reports: %q", lines)
	}
	for i, l := range lines[:3] {
		for _, want := range []string{"worker node exited (exit status 3)", "worker bad-worker event poison-event (crash journal)", "restarting it in", "node.log"} {
			if !strings.Contains(l, want) {
				t.Errorf("report %d %q lacks %q", i, l, want)
			}
		}
	}
	if !strings.Contains(lines[0], "in 10ms (restart 1)") || !strings.Contains(lines[2], "in 40ms (restart 3)") {
		t.Errorf("backoff not doubling to its maximum: %q", lines)
	}
}

// The supervisor stops the running process when its context ends.
func TestSupervisorStopsTheRunningProcess(t *testing.T) {
	dir := t.TempDir()
	sup := &Supervisor{Name: "node", Say: func(l string) { t.Errorf("unexpected report %q", l) },
		Start: func() (*Proc, error) { return StartProc(dir, "node", nil, "/bin/sh", "-c", "exec sleep 60") }}
	ctx, cancel := context.WithCancel(context.Background())
	started := sup.Started()
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx, func(p *Proc) { p.Stop(5 * time.Second) }) }()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("not started")
	}
	p := sup.Current()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !p.Exited() {
		t.Fatal("the process still runs after Run returned")
	}
}
