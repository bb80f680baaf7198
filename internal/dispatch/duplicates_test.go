package dispatch_test

import (
	"errors"
	"sync/atomic"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/internal/dispatch"
)

// docs/architecture.md, "At least once": a publish that fails partway
// through a call's outputs makes the message RETRY; the next attempt runs
// the worker again and publishes every output, so the ones before the
// failure go out twice, with the same ids (a downstream worker that keeps
// delivery records runs them once). Nothing is lost.
func TestPublishFailingPartwayPublishesTheFirstOutputsAgain(t *testing.T) {
	var calls atomic.Int32
	_, b, pub, s := oneWorker(t, 1, func(in *event.Event) ([]event.Event, error) {
		calls.Add(1)
		return outputs("out.a", "out.b")(in)
	})
	pub.FailWhen(func(topic string, _ *event.Event) error {
		if topic == "out.b" {
			return errors.New("broker refused out.b")
		}
		return nil
	})
	s.In <- request("m1", "")
	if a := waitAck(t, b); a.ID != "m1" || a.Status != dispatch.AckRetry {
		t.Fatalf("ack %+v, want RETRY after a partial publish", a)
	}
	pub.FailWhen(nil)
	s.In <- request("m1", "") // the broker's redelivery
	if a := waitAck(t, b); a.ID != "m1" || a.Status != dispatch.AckSuccess {
		t.Fatalf("redelivery ack %+v, want SUCCESS", a)
	}
	as, bs := pub.On("out.a"), pub.On("out.b")
	if calls.Load() != 2 || len(as) != 2 || len(bs) != 1 {
		t.Fatalf("%d calls, out.a published %d times, out.b %d: want 2, 2, 1", calls.Load(), len(as), len(bs))
	}
	if as[0].ID() != as[1].ID() || as[0].Source() != as[1].Source() {
		t.Fatalf("the repeated output changed identity: %s %s vs %s %s", as[0].Source(), as[0].ID(), as[1].Source(), as[1].ID())
	}
}
