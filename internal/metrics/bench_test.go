package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkPerMessage is what internal/dispatch adds for metrics to one
// message handled by one worker that succeeds with one output: five clock
// reads (handling start, dequeue, end of the engine call, record update
// start and end; the read after the record load was there before) and the
// updates of the cached series (record load, queue wait, received, in
// flight, processing, output, processed, record update, handling).
// Compare with BenchmarkDispatchOneOutput in internal/dispatch.
func BenchmarkPerMessage(b *testing.B) {
	m := New(prometheus.NewRegistry())
	w := m.Worker("w", "w-name", "python", "", 8)
	tp := m.Topic("in")
	base := time.Now()
	mono := func() int64 { return int64(time.Since(base)) }
	sec := func(from, to int64) float64 { return float64(to-from) / 1e9 }
	var now time.Time
	b.ReportAllocs()
	for range b.N {
		started := mono()
		now = base // the existing read after the record load
		loaded := int64(now.Sub(base))
		tp.RecordLoad.Observe(sec(started, loaded))
		dequeued := mono()
		w.QueueWait.Observe(sec(loaded, dequeued))
		w.Received.Inc()
		w.InFlight.Inc()
		w.Processing.Observe(sec(dequeued, mono()))
		w.Outputs.Inc()
		w.InFlight.Dec()
		w.Succeeded.Inc()
		updating := mono()
		ended := mono()
		tp.RecordUpdate.Observe(sec(updating, ended))
		tp.HandledSuccess.Observe(sec(started, ended))
	}
}

// BenchmarkFailed is the cost of counting a failed attempt (its reason's
// counter is looked up in the worker's cache).
func BenchmarkFailed(b *testing.B) {
	w := New(prometheus.NewRegistry()).Worker("w", "w-name", "python", "", 8)
	b.ReportAllocs()
	for range b.N {
		w.Failed("worker_failed")
	}
}
