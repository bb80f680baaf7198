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
	"go.opentelemetry.io/otel/propagation"

	"github.com/virtufin/workmanager/internal/tracing"
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
	// Propagator, when set, sends the trace context of the publishing
	// ctx's span to daprd (gRPC metadata traceparent, tracestate), which
	// continues the trace (internal/tracing.InjectGRPC).
	Propagator propagation.TextMapPropagator
}

// NewDapr publishes to the pub/sub component pubsub through client.
func NewDapr(client dapr.Client, pubsub string) *Dapr {
	return &Dapr{client: client, pubsub: pubsub}
}

// Publish implements Publisher.
func (p *Dapr) Publish(ctx context.Context, topic string, e *event.Event) error {
	return p.send(ctx, topic, e, nil)
}

// send publishes e as a structured CloudEvent, with per-request metadata
// when meta is not nil.
func (p *Dapr) send(ctx context.Context, topic string, e *event.Event, meta map[string]string) error {
	body, err := e.MarshalJSON()
	if err != nil {
		return fmt.Errorf("encode CloudEvent %s: %w", e.ID(), err)
	}
	if p.Propagator != nil {
		ctx = tracing.InjectGRPC(ctx, p.Propagator)
	}
	opts := []dapr.PublishEventOption{dapr.PublishEventWithContentType(ContentType)}
	if meta != nil {
		opts = append(opts, dapr.PublishEventWithMetadata(meta))
	}
	if err := p.client.PublishEvent(ctx, p.pubsub, topic, body, opts...); err != nil {
		return fmt.Errorf("publish %s to %s/%s: %w", e.ID(), p.pubsub, topic, err)
	}
	return nil
}

// maxLen is the per-request metadata that caps a topic's stream at about n
// entries ("maxLenApprox", honoured by WorkManager's daprd).
func maxLen(n int) map[string]string { return map[string]string{"maxLenApprox": strconv.Itoa(n)} }

// Capped returns a Publisher through the same component whose publishes
// keep each topic's stream at about n entries: for topics that are read
// live or not at all, such as infrastructure events.
func (p *Dapr) Capped(n int) Publisher { return capped{p, maxLen(n)} }

type capped struct {
	*Dapr
	meta map[string]string
}

func (c capped) Publish(ctx context.Context, topic string, e *event.Event) error {
	return c.send(ctx, topic, e, c.meta)
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
	if err := p.send(ctx, ProbeTopic, &e, maxLen(ProbeMaxLen)); err != nil {
		return fmt.Errorf("probe: %w", err)
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
