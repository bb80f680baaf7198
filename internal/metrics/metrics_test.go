package metrics

import (
	"errors"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/virtufin/workmanager/internal/grouplock"
)

func newTest(t *testing.T) (*Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	return New(reg), reg
}

// gathered renders the families of reg called names (text format, sorted),
// for comparisons that read like the scrape.
func gathered(t *testing.T, reg *prometheus.Registry, names ...string) string {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	var lines []string
	for _, f := range fams {
		if !want[f.GetName()] {
			continue
		}
		for _, m := range f.Metric {
			var b strings.Builder
			b.WriteString(f.GetName() + "{")
			for i, l := range m.Label {
				if i > 0 {
					b.WriteString(",")
				}
				b.WriteString(l.GetName() + "=" + l.GetValue())
			}
			b.WriteString("} ")
			switch {
			case m.Counter != nil:
				b.WriteString(ftoa(m.Counter.GetValue()))
			case m.Gauge != nil:
				b.WriteString(ftoa(m.Gauge.GetValue()))
			case m.Histogram != nil:
				b.WriteString("count=" + ftoa(float64(m.Histogram.GetSampleCount())))
			}
			lines = append(lines, b.String()+"\n")
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "")
}

// sortLines sorts the lines of s, as gathered does.
func sortLines(s string) string {
	lines := strings.SplitAfter(s, "\n")
	sort.Strings(lines)
	return strings.Join(lines, "")
}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

func TestWorkerCountsAndDelete(t *testing.T) {
	m, reg := newTest(t)
	a := m.Worker("a", "pricer", "python", "g1", 8)
	b := m.Worker("b", "", "native", "", 2)
	a.Received.Inc()
	a.Received.Inc()
	a.Succeeded.Inc()
	a.Outputs.Add(3)
	a.Failed("timeout")
	a.Failed("timeout")
	a.DeadLettered("timeout")
	a.Processing.Observe(0.01)
	a.QueueWait.Observe(0.001)
	a.InFlight.Inc()
	a.LockWait.Observe(0.002)
	a.StaleRefused.Inc()
	b.Received.Inc()
	b.Failed("worker_failed")
	if b.LockWait != nil || b.StaleRefused != nil {
		t.Error("a worker without a group has group-lock metrics")
	}

	got := gathered(t, reg, "workmanager_worker_messages_received_total", "workmanager_worker_messages_processed_total",
		"workmanager_worker_messages_failed_total", "workmanager_worker_messages_dead_lettered_total", "workmanager_worker_outputs_published_total",
		"workmanager_worker_in_flight", "workmanager_worker_concurrency_limit", "workmanager_worker_processing_seconds",
		"workmanager_grouplock_stale_refused_total", "workmanager_grouplock_acquire_seconds")
	want := `workmanager_grouplock_acquire_seconds{group=g1} count=1
workmanager_grouplock_stale_refused_total{group=g1} 1
workmanager_worker_concurrency_limit{engine=python,worker_id=a,worker_name=pricer} 8
workmanager_worker_concurrency_limit{engine=native,worker_id=b,worker_name=} 2
workmanager_worker_in_flight{engine=python,worker_id=a,worker_name=pricer} 1
workmanager_worker_in_flight{engine=native,worker_id=b,worker_name=} 0
workmanager_worker_messages_dead_lettered_total{engine=python,reason=timeout,worker_id=a,worker_name=pricer} 1
workmanager_worker_messages_failed_total{engine=python,reason=timeout,worker_id=a,worker_name=pricer} 2
workmanager_worker_messages_failed_total{engine=native,reason=worker_failed,worker_id=b,worker_name=} 1
workmanager_worker_messages_processed_total{engine=python,worker_id=a,worker_name=pricer} 1
workmanager_worker_messages_processed_total{engine=native,worker_id=b,worker_name=} 0
workmanager_worker_messages_received_total{engine=python,worker_id=a,worker_name=pricer} 2
workmanager_worker_messages_received_total{engine=native,worker_id=b,worker_name=} 1
workmanager_worker_outputs_published_total{engine=python,worker_id=a,worker_name=pricer} 3
workmanager_worker_outputs_published_total{engine=native,worker_id=b,worker_name=} 0
workmanager_worker_processing_seconds{engine=python,worker_id=a,worker_name=pricer} count=1
workmanager_worker_processing_seconds{engine=native,worker_id=b,worker_name=} count=0
`
	if want = sortLines(want); got != want {
		t.Fatalf("gathered:\n%s\nwant:\n%s", got, want)
	}

	// Deleting a removes every series of a, and only those; what a counts
	// afterwards (a straggler) brings none back. Group series stay.
	a.Delete()
	a.Failed("timeout")
	a.Failed("panic")
	a.DeadLettered("panic")
	got = gathered(t, reg, "workmanager_worker_messages_received_total", "workmanager_worker_messages_failed_total",
		"workmanager_worker_messages_dead_lettered_total", "workmanager_worker_concurrency_limit", "workmanager_worker_queue_wait_seconds",
		"workmanager_grouplock_stale_refused_total")
	want = `workmanager_grouplock_stale_refused_total{group=g1} 1
workmanager_worker_concurrency_limit{engine=native,worker_id=b,worker_name=} 2
workmanager_worker_messages_failed_total{engine=native,reason=worker_failed,worker_id=b,worker_name=} 1
workmanager_worker_messages_received_total{engine=native,worker_id=b,worker_name=} 1
workmanager_worker_queue_wait_seconds{engine=native,worker_id=b,worker_name=} count=0
`
	if want = sortLines(want); got != want {
		t.Fatalf("after Delete:\n%s\nwant:\n%s", got, want)
	}

	// Attached again: fresh series from zero.
	a2 := m.Worker("a", "pricer", "python", "g1", 8)
	a2.Failed("timeout")
	if v := testutil.ToFloat64(m.failed.WithLabelValues("a", "pricer", "python", "timeout")); v != 1 {
		t.Errorf("re-attached worker's failures = %v, want 1", v)
	}
}

func TestTopicCountsAndDelete(t *testing.T) {
	m, reg := newTest(t)
	in, other := m.Topic("in"), m.Topic("other")
	in.HandledSuccess.Observe(0.1)
	in.HandledRetry.Observe(0.2)
	in.Reconnects.Inc()
	in.DeadLettered("too_large")
	in.DeadLettered("too_large")
	in.RecordLoad.Observe(0.001)
	in.RecordUpdateError.Inc()
	other.Reconnects.Inc()
	got := gathered(t, reg, "workmanager_message_handling_seconds", "workmanager_stream_reconnects_total",
		"workmanager_topic_dead_lettered_total", "workmanager_delivery_record_seconds", "workmanager_delivery_record_errors_total")
	want := `workmanager_delivery_record_errors_total{op=load} 0
workmanager_delivery_record_errors_total{op=update} 1
workmanager_delivery_record_seconds{op=load} count=1
workmanager_delivery_record_seconds{op=update} count=0
workmanager_message_handling_seconds{status=retry,topic=in} count=1
workmanager_message_handling_seconds{status=success,topic=in} count=1
workmanager_message_handling_seconds{status=retry,topic=other} count=0
workmanager_message_handling_seconds{status=success,topic=other} count=0
workmanager_stream_reconnects_total{topic=in} 1
workmanager_stream_reconnects_total{topic=other} 1
workmanager_topic_dead_lettered_total{reason=too_large,topic=in} 2
`
	if want = sortLines(want); got != want {
		t.Fatalf("gathered:\n%s\nwant:\n%s", got, want)
	}
	in.Delete()
	in.DeadLettered("undecodable")
	got = gathered(t, reg, "workmanager_message_handling_seconds", "workmanager_stream_reconnects_total", "workmanager_topic_dead_lettered_total")
	want = `workmanager_message_handling_seconds{status=retry,topic=other} count=0
workmanager_message_handling_seconds{status=success,topic=other} count=0
workmanager_stream_reconnects_total{topic=other} 1
`
	if want = sortLines(want); got != want {
		t.Fatalf("after Delete:\n%s\nwant:\n%s", got, want)
	}
}

func TestGroupLockEvents(t *testing.T) {
	m, reg := newTest(t)
	for _, e := range []grouplock.Event{
		{Kind: grouplock.EventAcquired, Group: "g"},
		{Kind: grouplock.EventAcquired, Group: "g", Stolen: true},
		{Kind: grouplock.EventReleased, Group: "g"},
		{Kind: grouplock.EventTheftAborted, Group: "g"},
		{Kind: grouplock.EventTheftAborted, Group: "g"},
		{Kind: grouplock.EventContended, Group: "g"},
		{Kind: grouplock.EventContended, Group: "h"},
	} {
		m.GroupLockEvent(e)
	}
	got := gathered(t, reg, "workmanager_grouplock_acquisitions_total", "workmanager_grouplock_thefts_total",
		"workmanager_grouplock_thefts_aborted_total", "workmanager_grouplock_contentions_total")
	want := `workmanager_grouplock_acquisitions_total{group=g} 2
workmanager_grouplock_contentions_total{group=g} 1
workmanager_grouplock_contentions_total{group=h} 1
workmanager_grouplock_thefts_aborted_total{group=g} 2
workmanager_grouplock_thefts_total{group=g} 1
`
	if want = sortLines(want); got != want {
		t.Fatalf("gathered:\n%s\nwant:\n%s", got, want)
	}
}

func TestEngineRestarts(t *testing.T) {
	m, reg := newTest(t)
	m.EngineRestart("python", "process exited", nil)
	m.EngineRestart("python", "process exited", errors.New("no more processes"))
	m.EngineRestart("dotnet", "killed at the deadline", nil)
	got := gathered(t, reg, "workmanager_engine_process_restarts_total", "workmanager_engine_process_restart_failures_total")
	want := `workmanager_engine_process_restart_failures_total{engine=python,reason=process_exited} 1
workmanager_engine_process_restarts_total{engine=dotnet,reason=killed_at_the_deadline} 1
workmanager_engine_process_restarts_total{engine=python,reason=process_exited} 2
`
	if want = sortLines(want); got != want {
		t.Fatalf("gathered:\n%s\nwant:\n%s", got, want)
	}
}

func TestReasonLabel(t *testing.T) {
	for in, want := range map[string]string{
		"timeout":                "timeout",
		"process exited":         "process_exited",
		"I/O error":              "i_o_error",
		"killed at the deadline": "killed_at_the_deadline",
		"  call cancelled ":      "call_cancelled",
		"":                       "unknown",
		"!!!":                    "unknown",
		strings.Repeat("x", 100): strings.Repeat("x", 40),
	} {
		if got := ReasonLabel(in); got != want {
			t.Errorf("ReasonLabel(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRecoveryAndNodeGauges(t *testing.T) {
	m, reg := newTest(t)
	m.RecoveryDone(1500*time.Millisecond, nil)
	m.RecoveryDone(2*time.Second, errors.New("boom"))
	m.SetInFlight(func() int64 { return 4 })
	m.SetQueues(func() []Queue { return []Queue{{Worker: "a", Name: "pricer", Engine: "python", Length: 3}} })
	got := gathered(t, reg, "workmanager_recovery_duration_seconds", "workmanager_recoveries_total",
		"workmanager_messages_in_flight", "workmanager_worker_queue_length")
	want := `workmanager_messages_in_flight{} 4
workmanager_recoveries_total{result=failed} 1
workmanager_recoveries_total{result=succeeded} 1
workmanager_recovery_duration_seconds{} 2
workmanager_worker_queue_length{engine=python,worker_id=a,worker_name=pricer} 3
`
	if want = sortLines(want); got != want {
		t.Fatalf("gathered:\n%s\nwant:\n%s", got, want)
	}
}

// Every metric is named workmanager_… and follows Prometheus' naming
// conventions (units, _total on counters).
func TestNamesFollowTheConventions(t *testing.T) {
	m, reg := newTest(t)
	w := m.Worker("a", "pricer", "python", "g", 1)
	w.Failed("timeout")
	w.DeadLettered("timeout")
	tp := m.Topic("in")
	tp.DeadLettered("undecodable")
	m.GroupLockEvent(grouplock.Event{Kind: grouplock.EventAcquired, Group: "g", Stolen: true})
	m.GroupLockEvent(grouplock.Event{Kind: grouplock.EventTheftAborted, Group: "g"})
	m.GroupLockEvent(grouplock.Event{Kind: grouplock.EventContended, Group: "g"})
	m.EngineRestart("python", "timeout", errors.New("x"))
	m.RecoveryDone(time.Second, nil)
	m.SetQueues(func() []Queue { return []Queue{{Worker: "a", Engine: "python"}} })
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(fams) != 29 {
		t.Errorf("%d families, want 29 (every metric of New once counted)", len(fams))
	}
	for _, f := range fams {
		if !strings.HasPrefix(f.GetName(), Namespace+"_") {
			t.Errorf("%s is not prefixed %s_", f.GetName(), Namespace)
		}
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}
