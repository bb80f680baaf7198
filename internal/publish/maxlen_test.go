package publish_test

import (
	"context"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/internal/publish"
	"github.com/virtufin/workmanager/internal/publish/publishtest"
)

// Every publish through a Dapr publisher with MaxLen set caps its stream
// (issue 46 item 2); Capped and Probe keep their own, smaller caps; without
// MaxLen no cap is sent (the component's default applies).
func TestDaprPublishCapsEveryStream(t *testing.T) {
	ctx := context.Background()
	fake := &publishtest.DaprClient{}
	p := publish.NewDapr(fake, "pubsub")
	p.MaxLen = 1000000
	ev := event.New()
	ev.SetID("1")
	ev.SetType("t")
	ev.SetSource("s")
	if err := p.Publish(ctx, "orders.out", &ev); err != nil {
		t.Fatal(err)
	}
	if err := p.Capped(10000).Publish(ctx, "workmanager.infra.heartbeat", &ev); err != nil {
		t.Fatal(err)
	}
	if err := p.Probe(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	uncapped := publish.NewDapr(fake, "pubsub")
	if err := uncapped.Publish(ctx, "plain", &ev); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"orders.out": "1000000", "workmanager.infra.heartbeat": "10000", publish.ProbeTopic: "100", "plain": ""}
	calls := fake.Calls()
	if len(calls) != len(want) {
		t.Fatalf("%d calls, want %d: %+v", len(calls), len(want), calls)
	}
	for _, c := range calls {
		if got := c.Metadata["maxLenApprox"]; got != want[c.Topic] {
			t.Errorf("%s: maxLenApprox %q, want %q", c.Topic, got, want[c.Topic])
		}
	}
}
