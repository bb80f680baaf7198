package dotnet

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
)

// Issue 47 item 3 for .NET: a worker whose events are slow (30 ms of
// waiting) gets hosts on demand, up to its max_processes, shown by the
// worker's own enter/exit times; never more at once than that bound.
func TestSlowDotnetWorkerGetsHostsOnDemand(t *testing.T) {
	const maxProcs = 3
	e := newTestEngine(t, Config{Processes: 1, MaxProcesses: 8})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, ok := any(&Instance{}).(engines.Concurrent); !ok {
		t.Fatal("a .NET instance does not say how many calls it runs at once")
	}
	inst, err := e.Load(ctx, engines.Spec{WorkerID: "slow", MIMEType: MIMESource, Timeout: 20 * time.Second, MaxProcesses: maxProcs, Logger: testLogger(t)}, fixture(t, "sleeper"))
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(context.Background())
	if got := inst.(engines.Concurrent).MaxCalls(); got != maxProcs {
		t.Fatalf("MaxCalls %d, want the worker's max_processes %d", got, maxProcs)
	}
	var enter, exit []float64
	pids := map[float64]bool{}
	best := 0
	// Rounds of 8 events at once until the hosts started on demand show in
	// the overlap (their start takes a while on a loaded machine).
	for round := 0; round < 30 && best < maxProcs; round++ {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ev := event.New()
				ev.SetID(fmt.Sprintf("r%d-%d", round, i))
				ev.SetSource("test")
				ev.SetType("slow")
				out, err := inst.Process(ctx, &ev)
				if err != nil {
					t.Errorf("event %s: %v", ev.ID(), err)
					return
				}
				d := enginetest.DataOf(t, out)
				mu.Lock()
				defer mu.Unlock()
				enter, exit = append(enter, d["enter"].(float64)), append(exit, d["exit"].(float64))
				pids[d["pid"].(float64)] = true
			}()
		}
		wg.Wait()
		best = enginetest.MaxOverlap(enter, exit)
	}
	t.Logf("%d events, at most %d at once, on %d hosts", len(enter), best, len(pids))
	if best != maxProcs || len(pids) > maxProcs {
		t.Fatalf("at most %d events at once on %d hosts, want %d at once and no more than %d hosts", best, len(pids), maxProcs, maxProcs)
	}
}
