// Package publish owns how WorkManager sends CloudEvents out: structured
// CloudEvents published through Dapr pub/sub with the
// application/cloudevents+json content type, so that id, type, source and
// extensions (correlationid, ...) arrive exactly as sent.
package publish

import (
	"context"
	"fmt"
	"strconv"
	"time"

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

// Capped returns a Publisher through the same component whose publishes
// keep each topic's stream at about maxLen entries (the per-request
// "maxLenApprox" metadata that WorkManager's daprd honours): for topics that
// are read live or not at all, such as infrastructure events.
func (p *Dapr) Capped(maxLen int) Publisher { return capped{p, strconv.Itoa(maxLen)} }

type capped struct {
	*Dapr
	maxLen string
}

func (c capped) Publish(ctx context.Context, topic string, e *event.Event) error {
	body, err := e.MarshalJSON()
	if err != nil {
		return fmt.Errorf("encode CloudEvent %s: %w", e.ID(), err)
	}
	if err := c.client.PublishEvent(ctx, c.pubsub, topic, body, dapr.PublishEventWithContentType(ContentType),
		dapr.PublishEventWithMetadata(map[string]string{"maxLenApprox": c.maxLen})); err != nil {
		return fmt.Errorf("publish %s to %s/%s: %w", e.ID(), c.pubsub, topic, err)
	}
	return nil
}

// ProbeTopic receives the nodes' broker probes: small CloudEvents published
// only to learn whether the broker takes publishes. Nobody subscribes; the
// stream is capped at about ProbeMaxLen entries through the per-request
// "maxLenApprox" metadata that WorkManager's daprd honours.
const ProbeTopic = "workmanager.probe"

// ProbeMaxLen caps the probe topic's stream.
const ProbeMaxLen = 100

// Probe publishes one probe event from node to ProbeTopic.
func (p *Dapr) Probe(ctx context.Context, node string) error {
	e := event.New(event.CloudEventsVersionV1)
	e.SetID(node + "/" + strconv.FormatInt(time.Now().UnixNano(), 10))
	e.SetSource("workmanager/nodes/" + node)
	e.SetType("com.virtufin.workmanager.probe")
	body, err := e.MarshalJSON()
	if err != nil {
		return err
	}
	if err := p.client.PublishEvent(ctx, p.pubsub, ProbeTopic, body, dapr.PublishEventWithContentType(ContentType),
		dapr.PublishEventWithMetadata(map[string]string{"maxLenApprox": strconv.Itoa(ProbeMaxLen)})); err != nil {
		return fmt.Errorf("probe publish to %s/%s: %w", p.pubsub, ProbeTopic, err)
	}
	return nil
}

// Observed reports the outcome of every publish through pub to observe
// (the node's broker health check), then returns it.
func Observed(pub Publisher, observe func(error)) Publisher {
	return observed{pub, observe}
}

type observed struct {
	Publisher
	observe func(error)
}

func (o observed) Publish(ctx context.Context, topic string, e *event.Event) error {
	err := o.Publisher.Publish(ctx, topic, e)
	o.observe(err)
	return err
}
