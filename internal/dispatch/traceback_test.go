package dispatch_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/dispatch/dispatchtest"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/publish/publishtest"
	"github.com/virtufin/workmanager/internal/state"
	"github.com/virtufin/workmanager/internal/workerstats"
)

// workerErr is what an engine returns for an exception: ErrWorkerFailed
// with a traceback (engines.Traceback).
type workerErr struct{ msg, tb string }

func (e *workerErr) Error() string           { return engines.ErrWorkerFailed.Error() + ": " + e.msg }
func (e *workerErr) Unwrap() error           { return engines.ErrWorkerFailed }
func (e *workerErr) WorkerTraceback() string { return e.tb }

// Issue 44 item 2: a failed attempt's error event and the dead letter
// (stored, listed by the API) carry the worker's traceback, with the node's
// secrets and paths taken out like the error text's, and bounded keeping
// its end (the innermost frames); the events name the worker as well as
// its id. Item 3: the node counts the failures and the dead letter for
// GetWorker.
func TestDeadLetterAndErrorEventsCarryTheTraceback(t *testing.T) {
	b, pub, st := dispatchtest.NewBroker(), &publishtest.Recorder{}, state.NewMemoryStore()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	deps := testDeps(b, pub, st)
	deps.WorkerStats = workerstats.NewRecorder(st, "n1", quietLog())
	d := dispatch.New(ctx, quietLog(), deps, dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1, MaxAttempts: 2,
		Secrets: []string{"s3cr3t-token"}})
	padding := strings.Repeat("  File \"/usr/lib/python3.11/site-packages/lib.py\", line 1, in f\n", 400) // ~26 KiB
	tb := "Traceback (most recent call last):\n" + padding +
		"  File \"<worker>\", line 7, in process\n    total += item[\"price\"]\n" +
		"  File \"/opt/virtufin/node-data/extract/helper.py\", line 3, in get\n    token s3cr3t-token\nKeyError: 'price'\n"
	d.Attach(dispatch.Worker{ID: "w1", Name: "pricer", Topic: "in"}, &dispatchtest.FuncInstance{Fn: func(*event.Event) ([]event.Event, error) {
		return nil, &workerErr{msg: "KeyError: 'price'", tb: tb}
	}})
	s := waitStream(t, b, "in")
	for i, want := range []dispatch.Ack{dispatch.AckRetry, dispatch.AckSuccess} {
		s.In <- request("o-2", "")
		if a := waitAck(t, b); a.Status != want {
			t.Fatalf("delivery %d: ack %+v, want %v", i+1, a, want)
		}
	}
	check := func(what, got string) {
		t.Helper()
		if len(got) > 16<<10 {
			t.Errorf("%s: traceback of %d bytes, more than 16 KiB", what, len(got))
		}
		for _, w := range []string{"File \"<worker>\", line 7, in process", "File \".../helper.py\", line 3", "token [redacted]"} {
			if !strings.Contains(got, w) {
				t.Errorf("%s: traceback lacks %q:\n%s", what, w, got)
			}
		}
		if !strings.HasSuffix(got, "KeyError: 'price'\n") || strings.Contains(got, "s3cr3t") || strings.Contains(got, "/opt/virtufin") ||
			strings.HasPrefix(got, "Traceback") {
			t.Errorf("%s: traceback not cut at its start, or not redacted:\n%s", what, got[len(got)-300:])
		}
	}
	entries, err := d.DeadLetters.List(context.Background(), "w1", deadletter.Filter{}, 10)
	if err != nil || len(entries) != 1 {
		t.Fatalf("stored dead letters %+v %v", entries, err)
	}
	check("stored dead letter", entries[0].Traceback)
	var kinds []string
	for _, ev := range pub.On(lifecycleevents.Topic) {
		var data lifecycleevents.Data
		if err := json.Unmarshal(ev.Data(), &data); err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, strings.TrimPrefix(ev.Type(), lifecycleevents.TypePrefix))
		if data.WorkerName != "pricer" {
			t.Errorf("%s event: worker_name %q, want pricer", ev.Type(), data.WorkerName)
		}
		check(ev.Type(), data.Traceback)
	}
	if strings.Join(kinds, ",") != "error,error,dead_lettered" {
		t.Errorf("lifecycle events %v, want error, error, dead_lettered", kinds)
	}
	if err := deps.WorkerStats.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	tot, ok, err := workerstats.Read(context.Background(), st, "w1")
	if err != nil || !ok || tot.Processed != 0 || tot.Failed != 2 || tot.DeadLettered != 1 || tot.Last.EventID != "o-2" ||
		tot.Last.Text != "worker failed: KeyError: 'price'" || time.Since(time.UnixMilli(tot.Last.AtMS)) > time.Minute {
		t.Fatalf("stats %+v %v %v, want 2 failed, 1 dead-lettered, the last error", tot, ok, err)
	}
}
