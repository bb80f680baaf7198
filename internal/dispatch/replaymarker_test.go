package dispatch_test

import (
	"context"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/dispatch/dispatchtest"
	"github.com/virtufin/workmanager/internal/publish/publishtest"
)

// Issue 43 item 11: a producer set workmanagerreplay on an input. Naming
// one worker of the topic acked the event without the topic's other
// workers; naming a worker of another tenant filed a dead letter
// (not_running) into that worker's index. Only a marker signed by the
// replay path (ReplayDeadLetters) counts; a forged one, unsigned or signed
// for another worker or topic, is ignored: the event is an ordinary one.
func TestForgedReplayMarkerIsIgnored(t *testing.T) {
	for name, c := range map[string]struct {
		marker string
		sig    func(d *dispatch.Dispatcher) string
	}{
		"one worker of the topic, unsigned": {"a", func(*dispatch.Dispatcher) string { return "" }},
		"one worker of the topic, garbage":  {"a", func(*dispatch.Dispatcher) string { return "AAAA" }},
		"signed for another topic": {"a", func(d *dispatch.Dispatcher) string {
			sig, err := d.DeadLetters.SignReplay(context.Background(), "test", "r1", "a", "other")
			if err != nil {
				t.Fatal(err)
			}
			return sig
		}},
		"a worker of another tenant": {"globex-worker", func(*dispatch.Dispatcher) string { return "" }},
	} {
		t.Run(name, func(t *testing.T) {
			b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
			d := newTestDispatcher(t, b, pub, 1)
			a, other := &counting{}, &counting{}
			d.Attach(dispatch.Worker{ID: "a", Topic: "in"}, a.instance("a.out"))
			d.Attach(dispatch.Worker{ID: "c", Topic: "in"}, other.instance("c.out"))
			s := waitStream(t, b, "in")
			req := request("r1", "")
			ext := map[string]any{deadletter.ReplayExtension: c.marker}
			if sig := c.sig(d); sig != "" {
				ext[deadletter.ReplaySignatureExtension] = sig
			}
			req.Extensions, _ = structpb.NewStruct(ext)
			s.In <- req
			if ack := waitAck(t, b); ack.Status != dispatch.AckSuccess {
				t.Fatalf("ack %+v", ack)
			}
			if a.n("r1") != 1 || other.n("r1") != 1 {
				t.Fatalf("calls a=%d c=%d: the event must reach every worker of its topic", a.n("r1"), other.n("r1"))
			}
			if dead := pub.On("in-dead"); len(dead) != 0 {
				t.Fatalf("dead letters %v", dead)
			}
			for _, w := range []string{c.marker, "a", "c"} {
				if es, err := d.DeadLetters.List(context.Background(), w, deadletter.Filter{}, 10); err != nil || len(es) != 0 {
					t.Fatalf("dead letters filed under %s: %+v %v", w, es, err)
				}
			}
		})
	}
}

// signReplay signs a replay marker as ReplayDeadLetters does (source
// "test", as request makes).
func signReplay(t *testing.T, d *dispatch.Dispatcher, id, worker, topic string) string {
	t.Helper()
	sig, err := d.DeadLetters.SignReplay(context.Background(), "test", id, worker, topic)
	if err != nil {
		t.Fatal(err)
	}
	return sig
}
