package integration

import (
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/virtufin/workmanager/internal/dispatch"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// metricsWorker answers each input with one event on outTopic, raises on
// inputs whose data has "poison" and kills its own process on those with
// "crash" (the engine restarts it).
func metricsWorker(outTopic string) []byte {
	return []byte(fmt.Sprintf(`
import os

def process(event):
    data = event.get("data") or {}
    if data.get("crash"):
        os._exit(3)
    if data.get("poison"):
        raise ValueError("poisoned input " + event["id"])
    return {"type": %q, "data": {"n": data.get("n")}}
`, outTopic))
}

// scrape GETs the node's /metrics and parses it (Prometheus text format).
func (e *env) scrape(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	return scrapeURL(t, e.nodeURL)
}

// scrapeURL GETs the /metrics of the node at base and parses it.
func scrapeURL(t testing.TB, base string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("/metrics: HTTP %d, Content-Type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	return fams
}

// sampleValue is the value of the series of family name whose labels
// include want (a counter's or gauge's value, a histogram's sample count),
// summed over the series that match; -1 when none does.
func sampleValue(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
	sum, found := 0.0, false
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			match = match && labels[k] == v
		}
		if !match {
			continue
		}
		found = true
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		case m.Untyped != nil:
			sum += m.Untyped.GetValue()
		}
	}
	if !found {
		return -1
	}
	return sum
}

type expectedSample struct {
	name   string
	labels map[string]string
	value  float64
}

// TestMetrics runs a known workload on the real stack and reads the node's
// /metrics: a Python worker in a group processes five messages, dead-letters
// one that raises and one that kills its process (each after its two
// attempts; the engine restarts the process twice); a second worker, whose
// group's lock another holder keeps (written, so never stolen), fails its
// one attempt with lock_contention. The counts for both worker ids, their
// groups and the Python engine are exact; the Temporal SDK's own metrics
// are there too.
func TestMetrics(t *testing.T) {
	inTurn(t) // functional, no timing assertions: runs next to the other parallel tests after the serial ones
	e := newEnvWith(t, envConfig{nodeEnv: []string{"WORKER_MAX_ATTEMPTS=2", "WORKER_RETRY_BACKOFF=100ms", "WORKER_MAX_CONCURRENCY=4",
		"GROUP_LOCK_RETRY_BASE_DELAY_MS=50", "GROUP_LOCK_MAX_RETRIES=1", "GROUP_LOCK_MAX_AGE_MS=5000", "WORKMANAGER_NODE_ID=node-m"}})
	in, out, lockedIn := topicName(t, "in"), topicName(t, "out"), topicName(t, "locked")
	dead := collectFrom(e.subscribe(in + dispatch.DeadLetterSuffix))
	lockedDead := collectFrom(e.subscribe(lockedIn + dispatch.DeadLetterSuffix))
	outs := collectFrom(e.subscribe(out))
	suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
	group, busy := "m-"+suffix, "busy-"+suffix
	// Held past the max age (5 s) by a holder that wrote under its token and
	// whose node (this one) is alive: both tries of an acquisition abort the
	// theft, then it gives up.
	e.putState(t, "workmanager/grouplock/"+busy, map[string]any{"token": 41, "holder": "node-m/another-worker", "held": true,
		"acquired_ms": time.Now().Add(-6 * time.Second).UnixMilli(), "wrote": true})
	a := e.createWith(t, &pb.CreateWorkerRequest{Code: pyCode(metricsWorker(out)), Topic: in, Group: group})
	b := e.createWith(t, &pb.CreateWorkerRequest{Code: pyCode(metricsWorker(out)), Topic: lockedIn, Group: busy,
		RetryPolicy: &pb.RetryPolicy{MaxAttempts: 1}})

	const n = 5
	for i := range n {
		e.publish(in, "ok-"+strconv.Itoa(i), map[string]any{"n": i}, "")
	}
	waitFor(t, 60*time.Second, "the outputs of the good messages", func() bool { return outs.count() >= n })
	e.publish(in, "poison", map[string]any{"poison": true}, "")
	e.publish(lockedIn, "locked", map[string]any{"n": 0}, "")
	waitFor(t, 60*time.Second, "the dead letters of the poisoned and the locked message", func() bool {
		return dead.count() >= 1 && lockedDead.count() >= 1
	})
	// Alone, so that the crash cuts no other call short.
	e.publish(in, "crash", map[string]any{"crash": true}, "")
	waitFor(t, 60*time.Second, "the dead letter of the crashing message", func() bool { return dead.count() >= 2 })
	if evs := dead.get("crash"); len(evs) != 1 || evs[0].Extensions()["deadletterreason"] != "worker_failed" {
		t.Fatalf("crash dead letter %v", evs)
	}
	if evs := lockedDead.get("locked"); len(evs) != 1 || evs[0].Extensions()["deadletterreason"] != "lock_contention" {
		t.Fatalf("locked dead letter %v", evs)
	}

	wa := map[string]string{"worker_id": a, "engine": "python"}
	wb := map[string]string{"worker_id": b, "engine": "python"}
	with := func(l map[string]string, k, v string) map[string]string {
		out := map[string]string{k: v}
		for x, y := range l {
			out[x] = y
		}
		return out
	}
	want := []expectedSample{
		// a: 5 successes, 2 attempts of the poisoned one, 2 of the crashing one.
		{"workmanager_worker_messages_received_total", wa, n + 4},
		{"workmanager_worker_messages_processed_total", wa, n},
		{"workmanager_worker_messages_failed_total", with(wa, "reason", "worker_failed"), 4},
		{"workmanager_worker_messages_dead_lettered_total", with(wa, "reason", "worker_failed"), 2},
		{"workmanager_worker_outputs_published_total", wa, n},
		{"workmanager_worker_processing_seconds", wa, n + 4},
		{"workmanager_worker_queue_wait_seconds", wa, n + 4},
		{"workmanager_worker_queue_rejections_total", wa, 0},
		{"workmanager_worker_in_flight", wa, 0},
		{"workmanager_worker_concurrency_limit", wa, 4},
		{"workmanager_worker_queue_length", wa, 0},
		{"workmanager_grouplock_acquire_seconds", map[string]string{"group": group}, n + 4},
		{"workmanager_grouplock_contentions_total", map[string]string{"group": group}, -1},
		// b: one attempt, lost to the held lock; the engine never ran.
		{"workmanager_worker_messages_received_total", wb, 1},
		{"workmanager_worker_messages_processed_total", wb, 0},
		{"workmanager_worker_messages_failed_total", with(wb, "reason", "lock_contention"), 1},
		{"workmanager_worker_messages_dead_lettered_total", with(wb, "reason", "lock_contention"), 1},
		{"workmanager_worker_processing_seconds", wb, 0},
		{"workmanager_grouplock_contentions_total", map[string]string{"group": busy}, 1},
		{"workmanager_grouplock_thefts_aborted_total", map[string]string{"group": busy}, 2},
		{"workmanager_grouplock_acquisitions_total", map[string]string{"group": busy}, -1},
		// The crashing call killed its Python process twice.
		{"workmanager_engine_process_restarts_total", map[string]string{"engine": "python"}, 2},
		{"workmanager_engine_process_restart_failures_total", map[string]string{"engine": "python"}, -1},
		// The node's start-up recovery ran once, and nothing is in flight.
		{"workmanager_recoveries_total", map[string]string{"result": "succeeded"}, 1},
		{"workmanager_messages_in_flight", nil, 0},
		{"workmanager_topic_dead_lettered_total", map[string]string{"topic": in}, -1},
	}
	var fams map[string]*dto.MetricFamily
	var diff []string
	check := func() bool {
		fams = e.scrape(t)
		diff = diff[:0]
		for _, w := range want {
			if got := sampleValue(fams, w.name, w.labels); got != w.value {
				diff = append(diff, fmt.Sprintf("%s%v = %v, want %v", w.name, w.labels, got, w.value))
			}
		}
		return len(diff) == 0
	}
	deadline := time.Now().Add(20 * time.Second) // counts settle right after the acks and dead letters
	for !check() && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	if len(diff) > 0 {
		t.Errorf("metrics differ from the workload:\n  %s", strings.Join(diff, "\n  "))
	}

	// Taken in the store once per hold: a run of the group's messages on
	// the node shares one (GROUP_LOCK_KEEP_FOR), so from 1 to one per
	// attempt (each attempt's wait is workmanager_grouplock_acquire_seconds,
	// n + 4 above).
	if v := sampleValue(fams, "workmanager_grouplock_acquisitions_total", map[string]string{"group": group}); v < 1 || v > n+4 {
		t.Errorf("workmanager_grouplock_acquisitions_total{group=%s} = %v, want 1 to %d", group, v, n+4)
	}
	if d := sampleValue(fams, "workmanager_recovery_duration_seconds", nil); d <= 0 {
		t.Errorf("workmanager_recovery_duration_seconds = %v, want the recovery's duration", d)
	}
	for _, name := range []string{"workmanager_message_handling_seconds", "workmanager_delivery_record_seconds"} {
		if v := sampleValue(fams, name, nil); v <= 0 {
			t.Errorf("%s has %v samples, want some", name, v)
		}
	}
	// The Temporal SDK's own metrics, through the client's metrics handler.
	var temporal []string
	for name, f := range fams {
		if strings.HasPrefix(name, "temporal_") && len(f.Metric) > 0 {
			temporal = append(temporal, name)
		}
	}
	sort.Strings(temporal)
	if sampleValue(fams, "temporal_request_total", nil) <= 0 || sampleValue(fams, "temporal_long_request_total", nil) <= 0 {
		t.Errorf("no Temporal SDK request counters; temporal_ families: %v", temporal)
	}
	if sampleValue(fams, "temporal_request_latency_seconds", nil) <= 0 {
		t.Errorf("no temporal_request_latency_seconds histogram; temporal_ families: %v", temporal)
	}
	// Bounded labels: no event id reaches a label.
	for name, f := range fams {
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if v := l.GetValue(); v == "poison" || v == "crash" || strings.HasPrefix(v, "ok-") {
					t.Errorf("%s has an event id in label %s=%s", name, l.GetName(), v)
				}
			}
		}
	}
}
