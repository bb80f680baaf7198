package publish

import (
	"context"
	"errors"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
)

type failing struct{ err error }

func (f failing) Publish(context.Context, string, *event.Event) error { return f.err }

func TestObservedReportsEveryOutcome(t *testing.T) {
	var seen []error
	boom := errors.New("redis: connection pool timeout")
	for _, want := range []error{nil, boom} {
		p := Observed(failing{want}, func(err error) { seen = append(seen, err) })
		ev := event.New()
		if err := p.Publish(context.Background(), "t", &ev); !errors.Is(err, want) {
			t.Fatalf("Publish returned %v, want %v", err, want)
		}
	}
	if len(seen) != 2 || seen[0] != nil || !errors.Is(seen[1], boom) {
		t.Fatalf("observed %v", seen)
	}
}
