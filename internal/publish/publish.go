// Package publish owns how WorkManager sends CloudEvents out: structured
// CloudEvents published through Dapr pub/sub with the
// application/cloudevents+json content type, so that id, type, source and
// extensions (correlationid, ...) arrive exactly as sent.
package publish

import (
	"context"
	"fmt"

	"github.com/cloudevents/sdk-go/v2/event"
	dapr "github.com/dapr/go-sdk/client"
)

// ContentType is the content type of a structured CloudEvent.
const ContentType = "application/cloudevents+json"

// Publisher publishes one CloudEvent to a topic.
type Publisher interface {
	Publish(ctx context.Context, topic string, e *event.Event) error
}

// Dapr publishes through a Dapr pub/sub component.
type Dapr struct {
	client dapr.Client
	pubsub string
}

// NewDapr publishes to the pub/sub component pubsub through client.
func NewDapr(client dapr.Client, pubsub string) *Dapr {
	return &Dapr{client: client, pubsub: pubsub}
}

// Publish implements Publisher.
func (p *Dapr) Publish(ctx context.Context, topic string, e *event.Event) error {
	body, err := e.MarshalJSON()
	if err != nil {
		return fmt.Errorf("encode CloudEvent %s: %w", e.ID(), err)
	}
	if err := p.client.PublishEvent(ctx, p.pubsub, topic, body, dapr.PublishEventWithContentType(ContentType)); err != nil {
		return fmt.Errorf("publish %s to %s/%s: %w", e.ID(), p.pubsub, topic, err)
	}
	return nil
}
