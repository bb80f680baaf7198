package dispatch_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/delivery"
	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/dispatch/dispatchtest"
	"github.com/virtufin/workmanager/internal/grouplock"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/metrics"
	"github.com/virtufin/workmanager/internal/publish/publishtest"
	"github.com/virtufin/workmanager/internal/state"
)

// metricsDispatcher is a dispatcher whose metrics (and its group locks'
// events, as cmd/worker wires them) go to the registry it returns.
func metricsDispatcher(t *testing.T, b dispatch.Subscriber, pub *publishtest.Recorder, st state.Store, cfg dispatch.Config) (*dispatch.Dispatcher, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	deps := dispatch.Deps{Sub: b, Pub: pub, Events: lifecycleevents.NewEmitter(pub), Records: delivery.NewStore(st, time.Hour),
		Locks:       grouplock.New(st, grouplock.Config{RetryBase: time.Millisecond, MaxRetries: 2, OnEvent: m.GroupLockEvent}),
		DeadLetters: deadletter.NewStore(st, time.Hour), Metrics: m}
	return dispatch.New(ctx, quietLog(), deps, cfg), reg
}

// samples renders the series of reg whose family name starts with one of
// prefixes, one line each, sorted: "name{label=value,…} value", the value
// of a histogram being its sample count.
func samples(t *testing.T, reg *prometheus.Registry, prefixes ...string) string {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, f := range fams {
		keep := false
		for _, p := range prefixes {
			keep = keep || strings.HasPrefix(f.GetName(), p)
		}
		if !keep {
			continue
		}
		for _, m := range f.Metric {
			var labels []string
			for _, l := range m.Label {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			lines = append(lines, fmt.Sprintf("%s{%s} %v", f.GetName(), strings.Join(labels, ","), value(m)))
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return -1
}

func sortedLines(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := range lines {
		lines[i] = strings.TrimSpace(lines[i])
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func expectSamples(t *testing.T, reg *prometheus.Registry, want string, prefixes ...string) {
	t.Helper()
	if got, want := samples(t, reg, prefixes...), sortedLines(want); got != want {
		t.Fatalf("metrics:\n%s\n\nwant:\n%s", got, want)
	}
}

// A known sequence of messages gives exact counts: successes, outputs,
// failed attempts and dead letters per worker and reason, group-lock
// acquisitions, a raw dead letter of the topic, handling and record round
// trips; detaching a worker deletes its series, detaching the last worker
// of a topic the topic's.
func TestMetricsOfAKnownSequence(t *testing.T) {
	b, pub, st := dispatchtest.NewBroker(), &publishtest.Recorder{}, state.NewMemoryStore()
	d, reg := metricsDispatcher(t, b, pub, st, dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 2, MaxAttempts: 2})
	poison := &counting{fail: map[string]bool{"bad": true}}
	d.Attach(dispatch.Worker{ID: "good", Topic: "in", Engine: "python"}, &dispatchtest.FuncInstance{Fn: outputs("out.a", "out.b")})
	d.Attach(dispatch.Worker{ID: "poison", Topic: "in", Group: "g", Engine: "native"}, poison.instance("p.out"))
	s := waitStream(t, b, "in")
	for _, id := range []string{"m1", "m2", "m3"} {
		s.In <- request(id, "")
		if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
			t.Fatalf("%s: ack %+v", id, a)
		}
	}
	for i, want := range []dispatch.Ack{dispatch.AckRetry, dispatch.AckSuccess} { // MaxAttempts 2, then dead
		s.In <- request("bad", "")
		if a := waitAck(t, b); a.Status != want {
			t.Fatalf("bad, delivery %d: ack %+v, want %v", i+1, a, want)
		}
	}
	s.In <- &runtimev1.TopicEventRequest{Id: "raw", Type: "t", SpecVersion: "1.0", Data: []byte("\x00raw")}
	if a := waitAck(t, b); a.ID != "raw" || a.Status != dispatch.AckSuccess {
		t.Fatalf("raw: ack %+v", a)
	}
	// A message leaves the in-flight count just after its answer is sent.
	waitCond(t, func() bool {
		return strings.Contains(samples(t, reg, "workmanager_messages_in_flight"), "workmanager_messages_in_flight{} 0")
	}, func() string { return samples(t, reg, "workmanager_messages_in_flight") })

	expectSamples(t, reg, `
		workmanager_worker_concurrency_limit{engine=native,worker_id=poison,worker_name=} 2
		workmanager_worker_concurrency_limit{engine=python,worker_id=good,worker_name=} 2
		workmanager_worker_in_flight{engine=native,worker_id=poison,worker_name=} 0
		workmanager_worker_in_flight{engine=python,worker_id=good,worker_name=} 0
		workmanager_worker_messages_dead_lettered_total{engine=native,reason=worker_failed,worker_id=poison,worker_name=} 1
		workmanager_worker_messages_failed_total{engine=native,reason=worker_failed,worker_id=poison,worker_name=} 2
		workmanager_worker_messages_processed_total{engine=native,worker_id=poison,worker_name=} 3
		workmanager_worker_messages_processed_total{engine=python,worker_id=good,worker_name=} 4
		workmanager_worker_messages_received_total{engine=native,worker_id=poison,worker_name=} 5
		workmanager_worker_messages_received_total{engine=python,worker_id=good,worker_name=} 4
		workmanager_worker_outputs_published_total{engine=native,worker_id=poison,worker_name=} 3
		workmanager_worker_outputs_published_total{engine=python,worker_id=good,worker_name=} 8
		workmanager_worker_processing_seconds{engine=native,worker_id=poison,worker_name=} 5
		workmanager_worker_processing_seconds{engine=python,worker_id=good,worker_name=} 4
		workmanager_worker_queue_length{engine=native,worker_id=poison,worker_name=} 0
		workmanager_worker_queue_length{engine=python,worker_id=good,worker_name=} 0
		workmanager_worker_queue_rejections_total{engine=native,worker_id=poison,worker_name=} 0
		workmanager_worker_queue_rejections_total{engine=python,worker_id=good,worker_name=} 0
		workmanager_worker_queue_wait_seconds{engine=native,worker_id=poison,worker_name=} 5
		workmanager_worker_queue_wait_seconds{engine=python,worker_id=good,worker_name=} 4
		workmanager_grouplock_acquire_seconds{group=g} 5
		workmanager_grouplock_acquisitions_total{group=g} 5
		workmanager_grouplock_forwarded_total{group=g} 0
		workmanager_grouplock_stale_refused_total{group=g} 0
		workmanager_message_handling_seconds{status=retry,topic=in} 1
		workmanager_message_handling_seconds{status=success,topic=in} 5
		workmanager_messages_in_flight{} 0
		workmanager_stream_reconnects_total{topic=in} 0
		workmanager_topic_dead_lettered_total{reason=undecodable,topic=in} 1
		workmanager_delivery_record_seconds{op=load} 5
		workmanager_delivery_record_seconds{op=update} 5
		workmanager_delivery_record_errors_total{op=load} 0
		workmanager_delivery_record_errors_total{op=update} 0
	`, "workmanager_worker_", "workmanager_grouplock_", "workmanager_message", "workmanager_stream_", "workmanager_topic_", "workmanager_delivery_")

	// Detached: poison's series go, good's and the group's stay; with the
	// last worker of the topic, the topic's go too.
	d.Detach(context.Background(), "poison")
	if got := samples(t, reg, "workmanager_worker_"); strings.Contains(got, "poison") || !strings.Contains(got, "good") {
		t.Fatalf("after detaching poison:\n%s", got)
	}
	d.Detach(context.Background(), "good")
	expectSamples(t, reg, `
		workmanager_delivery_record_errors_total{op=load} 0
		workmanager_delivery_record_errors_total{op=update} 0
		workmanager_delivery_record_seconds{op=load} 5
		workmanager_delivery_record_seconds{op=update} 5
		workmanager_grouplock_acquire_seconds{group=g} 5
		workmanager_grouplock_acquisitions_total{group=g} 5
		workmanager_grouplock_forwarded_total{group=g} 0
		workmanager_grouplock_stale_refused_total{group=g} 0
		workmanager_messages_in_flight{} 0
	`, "workmanager_worker_", "workmanager_grouplock_", "workmanager_message", "workmanager_stream_", "workmanager_topic_", "workmanager_delivery_")
}

// A group whose lock stays held elsewhere: the attempt fails as
// lock_contention, counted for the worker and as one contention of the
// group; a worker whose queue stays full has the message given back,
// counted as a queue rejection.
func TestMetricsOfContentionAndQueueRejection(t *testing.T) {
	b, pub, st := dispatchtest.NewBroker(), &publishtest.Recorder{}, state.NewMemoryStore()
	held := fmt.Sprintf(`{"token":7,"holder":"other/x","held":true,"acquired_ms":%d,"wrote":true}`, time.Now().UnixMilli())
	if err := st.Put(context.Background(), grouplock.Key("busy"), []byte(held), state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	d, reg := metricsDispatcher(t, b, pub, st, dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1, QueueDepth: 1,
		QueueWait: time.Millisecond})
	d.Attach(dispatch.Worker{ID: "locked", Topic: "in", Group: "busy", MaxAttempts: 1, Engine: "python"}, &dispatchtest.FuncInstance{Fn: outputs("x")})
	s := waitStream(t, b, "in")
	s.In <- request("m1", "")
	if a := waitAck(t, b); a.Status != dispatch.AckSuccess { // MaxAttempts 1: dead-lettered at once
		t.Fatalf("ack %+v", a)
	}
	expectSamples(t, reg, `
		workmanager_grouplock_contentions_total{group=busy} 1
		workmanager_worker_messages_dead_lettered_total{engine=python,reason=lock_contention,worker_id=locked,worker_name=} 1
		workmanager_worker_messages_failed_total{engine=python,reason=lock_contention,worker_id=locked,worker_name=} 1
		workmanager_worker_messages_processed_total{engine=python,worker_id=locked,worker_name=} 0
		workmanager_worker_messages_received_total{engine=python,worker_id=locked,worker_name=} 1
		workmanager_worker_processing_seconds{engine=python,worker_id=locked,worker_name=} 0
	`, "workmanager_grouplock_acquisitions", // never acquired: no series
		"workmanager_grouplock_contentions", "workmanager_worker_messages", "workmanager_worker_processing")

	// Queue rejections: one call running, one queued, the third finds the
	// queue full for QueueWait.
	s2, _, release := fullQueue(t, d, b, dispatch.Worker{ID: "slow", Topic: "in2", Engine: "python"})
	s2.In <- request("q3", "")
	if a := waitAck(t, b); a.ID != "q3" || a.Status != dispatch.AckRetry {
		t.Fatalf("ack %+v, want q3 given back", a)
	}
	expectSamples(t, reg, `
		workmanager_worker_in_flight{engine=python,worker_id=slow,worker_name=} 1
		workmanager_worker_queue_length{engine=python,worker_id=slow,worker_name=} 1
		workmanager_worker_queue_rejections_total{engine=python,worker_id=slow,worker_name=} 1
		workmanager_worker_in_flight{engine=python,worker_id=locked,worker_name=} 0
		workmanager_worker_queue_length{engine=python,worker_id=locked,worker_name=} 0
		workmanager_worker_queue_rejections_total{engine=python,worker_id=locked,worker_name=} 0
	`, "workmanager_worker_in_flight", "workmanager_worker_queue_length", "workmanager_worker_queue_rejections")
	// Node-wide, q1 and q2: q3 leaves the count just after its answer is
	// sent (it failed once under load when read at once).
	waitCond(t, func() bool {
		return samples(t, reg, "workmanager_messages_in_flight") == "workmanager_messages_in_flight{} 2"
	}, func() string { return samples(t, reg, "workmanager_messages_in_flight") })
	close(release)
	for range 2 {
		waitAck(t, b)
	}
}

func waitQueued(t *testing.T, d *dispatch.Dispatcher, id string, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for d.Queued(id) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d queued for %s, want %d", d.Queued(id), id, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// An output refused because another holder took the lock over is counted
// for the group; a lost stream is counted as a reconnect of its topic.
func TestMetricsOfStaleOutputAndReconnect(t *testing.T) {
	b, pub, st := dispatchtest.NewBroker(), &publishtest.Recorder{}, state.NewMemoryStore()
	d, reg := metricsDispatcher(t, b, pub, st, dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1,
		ReconnectMin: time.Millisecond, ReconnectMax: time.Millisecond})
	entered, release := make(chan struct{}), make(chan struct{})
	d.Attach(dispatch.Worker{ID: "w", Topic: "in", Group: "g"}, &dispatchtest.FuncInstance{Fn: func(in *event.Event) ([]event.Event, error) {
		close(entered)
		<-release
		return outputs("out")(in)
	}})
	s := waitStream(t, b, "in")
	s.In <- request("m", "")
	<-entered
	it, err := st.Get(context.Background(), grouplock.Key("g"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Put(context.Background(), grouplock.Key("g"), []byte(`{"token":99,"holder":"other/x","held":true,"acquired_ms":1}`), state.PutOptions{ETag: it.ETag}); err != nil {
		t.Fatal(err)
	}
	close(release)
	if a := waitAck(t, b); a.Status != dispatch.AckRetry {
		t.Fatalf("ack %+v, want RETRY", a)
	}
	s.Close()
	deadline := time.Now().Add(5 * time.Second)
	for b.Subscriptions() < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	expectSamples(t, reg, `
		workmanager_grouplock_stale_refused_total{group=g} 1
		workmanager_stream_reconnects_total{topic=in} 1
		workmanager_worker_messages_failed_total{engine=,reason=stale_lock,worker_id=w,worker_name=} 1
		workmanager_worker_outputs_published_total{engine=,worker_id=w,worker_name=} 0
	`, "workmanager_grouplock_stale", "workmanager_stream_", "workmanager_worker_messages_failed", "workmanager_worker_outputs")
}
