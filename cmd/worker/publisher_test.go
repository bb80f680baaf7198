package main

import (
	"context"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/publish"
	"github.com/virtufin/workmanager/internal/publish/publishtest"
)

// Every stream the node publishes to is capped (issue 46 item 2): the one
// publisher main gives the dispatcher (outputs, <topic>-dead) and the
// lifecycle emitter sends maxLenApprox=STREAM_MAX_LEN with each publish.
func TestNodePublisherCapsOutputsDeadLettersAndLifecycle(t *testing.T) {
	for _, setting := range []string{"", "250000"} {
		t.Setenv("STREAM_MAX_LEN", setting)
		cfg, err := loadConfig()
		if err != nil {
			t.Fatal(err)
		}
		want := setting
		if want == "" {
			want = "1000000"
		}
		fake := &publishtest.DaprClient{}
		pub := publish.Observed(newPublisher(fake, cfg), func(error) {})
		ctx := context.Background()
		ev := event.New()
		ev.SetID("e1")
		ev.SetType("t")
		ev.SetSource("s")
		for _, topic := range []string{"orders.out", "orders-dead"} { // dispatch's outputs and dead letters
			if err := pub.Publish(ctx, topic, &ev); err != nil {
				t.Fatal(err)
			}
		}
		if err := lifecycleevents.NewEmitter(pub).Emit(ctx, "w1", lifecycleevents.Created, lifecycleevents.Data{}); err != nil {
			t.Fatal(err)
		}
		calls := fake.Calls()
		if len(calls) != 3 {
			t.Fatalf("%d publishes, want 3", len(calls))
		}
		for _, c := range calls {
			if c.PubSub != cfg.PubSub || c.Metadata["maxLenApprox"] != want {
				t.Errorf("STREAM_MAX_LEN=%q: publish to %s/%s with metadata %v, want maxLenApprox=%s", setting, c.PubSub, c.Topic, c.Metadata, want)
			}
		}
	}
}
