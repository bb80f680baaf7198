package dispatch_test

import (
	"encoding/json"
	"sync/atomic"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
)

// A worker's own error answer (engines.ErrorAnswer: the native ABI's
// error_message with return code 0) is not a failed attempt: one
// worker.error event, its error response published (a default one when it
// gave none), the event done at once — no retry, no dead letter.
func TestErrorAnswerIsPublishedOnceWithoutRetry(t *testing.T) {
	for name, tc := range map[string]struct {
		outputs  []string // the worker's own error response types
		wantType string
	}{
		"default response": {nil, "in" + dispatch.ErrorSuffix},
		"its own response": {[]string{"orders.failed"}, "orders.failed"},
	} {
		t.Run(name, func(t *testing.T) {
			var calls atomic.Int32
			_, b, pub, s := oneWorker(t, 1, func(in *event.Event) ([]event.Event, error) {
				calls.Add(1)
				var outs []event.Event
				for _, typ := range tc.outputs {
					e := event.New()
					e.SetType(typ)
					outs = append(outs, e)
				}
				return nil, &engines.ErrorAnswer{Message: "no stock", Outputs: outs}
			})
			s.In <- request("m1", "corr-1")
			if a := waitAck(t, b); a.ID != "m1" || a.Status != dispatch.AckSuccess {
				t.Fatalf("ack %+v, want SUCCESS at once", a)
			}
			if calls.Load() != 1 {
				t.Fatalf("%d calls, want 1", calls.Load())
			}
			got := pub.On(tc.wantType)
			if len(got) != 1 {
				t.Fatalf("%d events on %s, want 1 (all: %v)", len(got), tc.wantType, pub.All())
			}
			ev := got[0]
			if ev.Extensions()[dispatch.CorrelationExtension] != "corr-1" || ev.Source() != "workmanager/workers/w1" || ev.ID() == "" {
				t.Fatalf("error response %v: want the input's correlation id and the node's defaults", ev)
			}
			if tc.outputs == nil {
				var data map[string]string
				if err := json.Unmarshal(ev.Data(), &data); err != nil || data["error"] != "no stock" || data["input_id"] != "m1" || data["input_type"] != "in" {
					t.Fatalf("default error response data %s (%v)", ev.Data(), err)
				}
			}
			if dead := pub.On("in-dead"); len(dead) != 0 {
				t.Fatalf("%d dead letters, want none", len(dead))
			}
			var errorsSeen int
			for _, e := range pub.On(lifecycleevents.Topic) {
				if e.Type() != lifecycleevents.TypePrefix+string(lifecycleevents.Error) {
					continue
				}
				errorsSeen++
				var d lifecycleevents.Data
				if err := json.Unmarshal(e.Data(), &d); err != nil || d.ErrorType != dispatch.ErrorTypeAnswer || d.ErrorMessage != "no stock" || d.EventID != "m1" {
					t.Fatalf("worker.error %s (%v)", e.Data(), err)
				}
			}
			if errorsSeen != 1 {
				t.Fatalf("%d worker.error events, want 1", errorsSeen)
			}
		})
	}
}

// A DevKit's error response (type "….error", data {"error", "input_id",
// "input_type"} of this input) is published as it is and announced once as
// worker.error; an output that only looks like one (another input's id) is
// not; the event is done.
func TestDevKitErrorResponseIsAnnounced(t *testing.T) {
	_, b, pub, s := oneWorker(t, 1, func(in *event.Event) ([]event.Event, error) {
		e := event.New()
		e.SetType("orders.priced.error")
		inputID := in.ID()
		if in.ID() == "m2" {
			inputID = "someone-else"
		}
		_ = e.SetData(event.ApplicationJSON, map[string]string{"error": "no stock", "input_id": inputID, "input_type": in.Type()})
		return []event.Event{e}, nil
	})
	for _, id := range []string{"m1", "m2"} {
		s.In <- request(id, "")
		if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
			t.Fatalf("ack %+v", a)
		}
	}
	if got := pub.On("orders.priced.error"); len(got) != 2 {
		t.Fatalf("%d error responses published, want 2", len(got))
	}
	var ids []string
	for _, e := range pub.On(lifecycleevents.Topic) {
		var d lifecycleevents.Data
		if e.Type() == lifecycleevents.TypePrefix+string(lifecycleevents.Error) && json.Unmarshal(e.Data(), &d) == nil &&
			d.ErrorType == dispatch.ErrorTypeAnswer && d.ErrorMessage == "no stock" {
			ids = append(ids, d.EventID)
		}
	}
	if len(ids) != 1 || ids[0] != "m1" {
		t.Fatalf("worker.error events for %v, want one for m1", ids)
	}
}
