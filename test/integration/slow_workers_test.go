package integration

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"google.golang.org/protobuf/proto"

	"github.com/virtufin/workmanager/engines/enginetest"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Issue 47, item 3: slow workers overlap on the real stack. 16 events
// published at once (after a first burst of 16 that starts the extra
// runners) to a worker that waits 30 ms per event: an async def
// worker runs at least 8 at the same time on its event loop, a plain def
// worker with max_processes 4 runs 4 at a time in 4 runners. Shown by the
// workers' own enter and exit times; nothing here is timed.
func TestSlowWorkersOverlap(t *testing.T) {
	inTurn(t) // functional: the overlap is counted, not timed
	e := newEnv(t, "")
	for _, c := range []struct {
		name, code string
		req        func(*pb.CreateWorkerRequest)
		atLeast    int
		atMost     int
	}{
		{name: "async", code: `
import asyncio, os, time

async def process(event):
    enter = time.time()
    await asyncio.sleep(0.03)
    return {"type": %q, "data": {"enter": enter, "exit": time.time(), "pid": os.getpid()}}
`, req: func(r *pb.CreateWorkerRequest) { r.MaxConcurrency = proto.Int32(16) }, atLeast: 8, atMost: 16},
		{name: "def", code: `
import os, time

def process(event):
    enter = time.time()
    time.sleep(0.03)
    return {"type": %q, "data": {"enter": enter, "exit": time.time(), "pid": os.getpid()}}
`, req: func(r *pb.CreateWorkerRequest) { r.MaxProcesses = proto.Int32(4) }, atLeast: 4, atMost: 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			in, out := topicName(t, "in"), topicName(t, "out")
			outs := e.subscribe(out)
			req := &pb.CreateWorkerRequest{Code: pyCode([]byte(fmt.Sprintf(c.code, out))), Topic: in}
			c.req(req)
			e.createWith(t, req)
			// A first burst starts the def worker's extra runners (a start
			// may take longer than the burst's work); the next are counted,
			// up to five of them while a loaded machine spreads a burst's
			// deliveries too thin to show the bound. None may exceed it.
			burst(t, e, in, outs, "warm")
			best := 0
			for round := 0; round < 5 && best < c.atLeast; round++ {
				ivs := burst(t, e, in, outs, fmt.Sprintf("slow%d", round))
				got := maxSimultaneous(ivs)
				t.Logf("%s, burst %d: at most %d of 16 events ran at the same time", c.name, round, got)
				if got > c.atMost {
					t.Fatalf("%s worker: %d events ran at the same time, more than %d: %+v", c.name, got, c.atMost, ivs)
				}
				best = max(best, got)
			}
			if best < c.atLeast {
				t.Fatalf("%s worker: at most %d events ran at the same time in 5 bursts, want %d..%d", c.name, best, c.atLeast, c.atMost)
			}
		})
	}
}

// burst publishes 16 events to in at once and returns the intervals the
// worker reported in its outputs.
func burst(t *testing.T, e *env, in string, outs <-chan event.Event, prefix string) []runInterval {
	t.Helper()
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() { e.publish(in, fmt.Sprintf("%s-%d", prefix, i), map[string]any{"i": i}, "") })
	}
	wg.Wait()
	var ivs []runInterval
	seen := map[string]bool{}
	for len(seen) < 16 {
		ev := expectEvent(t, outs, 60*time.Second)
		if seen[ev.ID()] || !strings.HasPrefix(ev.ID(), prefix+"-") {
			continue // a redelivery's output
		}
		seen[ev.ID()] = true
		var d runInterval
		if err := ev.DataAs(&d); err != nil {
			t.Fatal(err)
		}
		ivs = append(ivs, d)
	}
	return ivs
}

// runInterval is one event's run as the worker reported it.
type runInterval struct {
	Enter float64 `json:"enter"`
	Exit  float64 `json:"exit"`
	Pid   float64 `json:"pid"`
}

// maxSimultaneous is the most intervals open at one instant.
func maxSimultaneous(ivs []runInterval) int {
	enter, exit := make([]float64, len(ivs)), make([]float64, len(ivs))
	for i, iv := range ivs {
		enter[i], exit[i] = iv.Enter, iv.Exit
	}
	return enginetest.MaxOverlap(enter, exit)
}
