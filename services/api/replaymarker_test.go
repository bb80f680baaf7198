package api

import (
	"context"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/deadletter"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Issue 43 item 11, the API's side: a node honours a replay marker only
// with the signature of the replay path. The API signs each event it
// replays for the worker and topic it replays it to, with the key in the
// state store it shares with the nodes: a node's own dead-letter store
// (another instance over the same state) accepts it, and not for another
// worker or topic.
func TestReplayedEventsCarryASignatureTheNodesAccept(t *testing.T) {
	e := newDLServerWithFour(t)
	ctx := context.Background()
	if _, err := e.s.ReplayDeadLetters(ctx, &pb.ReplayDeadLettersRequest{WorkerId: w1, Limit: 1}); err != nil {
		t.Fatal(err)
	}
	if len(e.pub.All()) != 1 {
		t.Fatalf("published %v", e.pub.All())
	}
	p := e.pub.All()[0]
	sig, _ := p.Event.Extensions()[deadletter.ReplaySignatureExtension].(string)
	if sig == "" {
		t.Fatalf("replayed without a signature: %s", p.Event)
	}
	node := deadletter.NewStore(e.mem, time.Hour)
	for _, c := range []struct {
		worker, topic string
		want          bool
	}{{w1, p.Topic, true}, {w2, p.Topic, false}, {w1, "payments", false}} {
		ok, err := node.VerifyReplay(ctx, p.Event.Source(), p.Event.ID(), c.worker, c.topic, sig)
		if err != nil || ok != c.want {
			t.Fatalf("verify for %s on %s: %v %v, want %v", c.worker, c.topic, ok, err, c.want)
		}
	}
}
