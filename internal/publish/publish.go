// Package publish owns how WorkManager sends CloudEvents out: structured
// CloudEvents published through Dapr pub/sub with the
// application/cloudevents+json content type, so that id, type, source and
// extensions (correlationid, ...) arrive exactly as sent.
package publish

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"
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

// Batcher is a Publisher that also publishes several CloudEvents to one
// topic in one request, in their order (the outputs of a group's calls,
// which must appear in fencing-token order).
type Batcher interface {
	Publisher
	// PublishBatch publishes es to topic in their order. On an error,
	// none of them is known to be published (some may be: a retry may
	// publish them again, never out of order).
	PublishBatch(ctx context.Context, topic string, es []*event.Event) error
}

// FencingExtension is the CloudEvents extension that carries the fencing
// token of the group lock an output was made under.
const FencingExtension = "fencingtoken"

// ErrFenced: the broker refused fenced outputs because it already took, on
// that topic, an output of the same lock with a higher fencing token — their
// maker no longer held the lock (a node paused between its lock check and
// its publish). Nothing of the request was published.
var ErrFenced = errors.New("refused by the broker's fence: a later holder of the group's lock already published to this topic")

// Fencer is a Publisher whose broker checks fencing tokens (WorkManager's
// daprd, deploy/dapr/daprd/redisstreams change 12).
type Fencer interface {
	Publisher
	// PublishFenced publishes es to topic in their order, in one request,
	// unless the broker already took an output of lock on topic with a
	// higher fencing token than the first of es (extension
	// FencingExtension, in order in es): then none of them, and the error
	// wraps ErrFenced. On another error none of them is known to be
	// published, as PublishBatch.
	PublishFenced(ctx context.Context, topic, lock string, es []*event.Event) error
}

// Fenced publishes es to topic as Batch does, fenced by lock (see Fencer)
// when pub is a Fencer and lock is not "", in one request that publishes
// all of them or none.
func Fenced(ctx context.Context, pub Publisher, topic, lock string, es []*event.Event) (int, error) {
	if f, ok := pub.(Fencer); ok && lock != "" && len(es) > 0 {
		if err := f.PublishFenced(ctx, topic, lock, es); err != nil {
			return 0, err
		}
		return len(es), nil
	}
	return Batch(ctx, pub, topic, es)
}

// Batch publishes es to topic in their order: in one request when pub is a
// Batcher and es holds more than one, else one after another, stopping at
// the first error. It returns how many are known to be published.
func Batch(ctx context.Context, pub Publisher, topic string, es []*event.Event) (int, error) {
	if b, ok := pub.(Batcher); ok && len(es) > 1 {
		if err := b.PublishBatch(ctx, topic, es); err != nil {
			return 0, err
		}
		return len(es), nil
	}
	for i, e := range es {
		if err := pub.Publish(ctx, topic, e); err != nil {
			return i, err
		}
	}
	return len(es), nil
}

// Dapr publishes through a Dapr pub/sub component.
type Dapr struct {
	client dapr.Client
	pubsub string
	// Propagator, when set, sends the trace context of the publishing
	// ctx's span to daprd (gRPC metadata traceparent, tracestate), which
	// continues the trace (internal/tracing.InjectGRPC).
	Propagator propagation.TextMapPropagator
	// MaxLen, when positive, caps the stream of every topic Publish sends
	// to at about this many entries (per-request "maxLenApprox", honoured
	// by WorkManager's daprd): STREAM_MAX_LEN. Redis trims the oldest
	// entries whether or not a consumer group acknowledged them, so size it
	// as docs/scaling.md, "Stream length", says. 0 sends no cap (the
	// component's own maxLenApprox, if any, applies).
	MaxLen int
}

// NewDapr publishes to the pub/sub component pubsub through client.
func NewDapr(client dapr.Client, pubsub string) *Dapr {
	return &Dapr{client: client, pubsub: pubsub}
}

// Publish implements Publisher: outputs, dead letters, lifecycle events and
// replays, each stream capped at MaxLen entries when it is set.
func (p *Dapr) Publish(ctx context.Context, topic string, e *event.Event) error {
	return p.send(ctx, topic, e, p.capMeta())
}

// send publishes e as a structured CloudEvent, with per-request metadata
// when meta is not nil (a fenced output's: PublishFenced).
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
		return fmt.Errorf("publish %s to %s/%s: %w", e.ID(), p.pubsub, topic, fenced(err))
	}
	return nil
}

// PublishBatch implements Batcher through Dapr's bulk publish
// (BulkPublishEventAlpha1): WorkManager's daprd adds the entries to the
// topic's stream in their order in one step (deploy/dapr/daprd/redisstreams,
// change 11), each as Publish would, capped at MaxLen.
func (p *Dapr) PublishBatch(ctx context.Context, topic string, es []*event.Event) error {
	return p.bulk(ctx, topic, "", es)
}

// PublishFenced implements Fencer: PublishBatch's request, each entry
// with its lock and token (metadata fenceLock, fenceToken), which
// WorkManager's daprd checks against the topic's high-water mark of the
// lock in the same step as it adds them. A single output goes as Publish
// sends one, with that metadata: daprd's component takes it through the
// same check (and daprd spends about 15 µs less on it than on a bulk
// request of one, measured through the real daprd).
func (p *Dapr) PublishFenced(ctx context.Context, topic, lock string, es []*event.Event) error {
	if lock == "" {
		return errors.New("publish: a fenced publish without a lock")
	}
	if len(es) == 1 {
		// One fenced output (a keyed group's call, most often): daprd's
		// PublishEvent hands the metadata to the component's Publish,
		// which takes it through the same script as a bulk request
		// (change 12).
		m, err := fenceMeta(es[0], lock, p.capMeta())
		if err != nil {
			return err
		}
		return p.send(ctx, topic, es[0], m)
	}
	return p.bulk(ctx, topic, lock, es)
}

// FencedRun is one lock's outputs in a PublishFencedRuns request, in
// fencing-token order.
type FencedRun struct {
	Lock   string
	Events []*event.Event
}

// RunsFencer is a Fencer that also publishes the outputs of several locks
// to one topic in one request (WorkManager's daprd, change 13), each
// lock's run checked against its own fence.
type RunsFencer interface {
	Fencer
	// PublishFencedRuns publishes runs to topic in one request: each run
	// is published, in its order, or refused by its lock's fence on its
	// own. It returns one error per run (nil: published; wrapping
	// ErrFenced: refused, nothing of it published), or an error for the
	// request as a whole (then none is known to be published).
	PublishFencedRuns(ctx context.Context, topic string, runs []FencedRun) ([]error, error)
}

// MaxFencedRuns bounds the runs of one PublishFencedRuns request (the
// broker's bound: deploy/dapr/daprd/redisstreams, maxFenceRuns).
const MaxFencedRuns = 48

// PublishFencedRuns implements RunsFencer through Dapr's bulk publish,
// read from daprd's own answer (the go-sdk keeps which entries failed, not
// why): each entry carries its run's lock and its fencing token.
func (p *Dapr) PublishFencedRuns(ctx context.Context, topic string, runs []FencedRun) ([]error, error) {
	if len(runs) > MaxFencedRuns {
		return nil, fmt.Errorf("publish: %d fenced runs in one request, more than %d", len(runs), MaxFencedRuns)
	}
	meta := p.capMeta()
	req := &runtimev1.BulkPublishRequest{PubsubName: p.pubsub, Topic: topic}
	for g, ru := range runs {
		if ru.Lock == "" || len(ru.Events) == 0 {
			return nil, fmt.Errorf("publish: fenced run %d without a lock or events", g)
		}
		for i, e := range ru.Events {
			body, m, err := bulkEntry(e, ru.Lock, meta)
			if err != nil {
				return nil, err
			}
			req.Entries = append(req.Entries, &runtimev1.BulkPublishRequestEntry{
				EntryId: strconv.Itoa(g) + "/" + strconv.Itoa(i), Event: body, ContentType: ContentType, Metadata: m})
		}
	}
	if p.Propagator != nil {
		ctx = tracing.InjectGRPC(ctx, p.Propagator)
	}
	res, err := p.client.GrpcClient().BulkPublishEventAlpha1(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("publish %d fenced runs to %s/%s: %w", len(runs), p.pubsub, topic, fenced(err))
	}
	errs := make([]error, len(runs))
	for _, f := range res.GetFailedEntries() {
		run, _, _ := strings.Cut(f.GetEntryId(), "/")
		g, err := strconv.Atoi(run)
		if err != nil || g < 0 || g >= len(runs) {
			return nil, fmt.Errorf("publish to %s/%s: daprd reported a failed entry %q that was not sent", p.pubsub, topic, f.GetEntryId())
		}
		if errs[g] == nil {
			errs[g] = fmt.Errorf("publish %d fenced outputs (%s first) of lock %s to %s/%s: %w", len(runs[g].Events), runs[g].Events[0].ID(), runs[g].Lock, p.pubsub, topic, fenced(errors.New(f.GetError())))
		}
	}
	return errs, nil
}

// The per-entry metadata of a fenced output, and the start of the error
// of a request daprd's fence refused (deploy/dapr/daprd/redisstreams,
// change 12).
const (
	fenceLockKey  = "fenceLock"
	fenceTokenKey = "fenceToken"
	fencedReply   = "WMFENCED"
)

func (p *Dapr) bulk(ctx context.Context, topic, lock string, es []*event.Event) error {
	meta := p.capMeta()
	entries := make([]any, len(es))
	for i, e := range es {
		body, m, err := bulkEntry(e, lock, meta)
		if err != nil {
			return err
		}
		entries[i] = dapr.PublishEventsEvent{EntryID: strconv.Itoa(i), Data: body, ContentType: ContentType, Metadata: m}
	}
	if p.Propagator != nil {
		ctx = tracing.InjectGRPC(ctx, p.Propagator)
	}
	if res := p.client.PublishEvents(ctx, p.pubsub, topic, entries); res.Error != nil {
		return fmt.Errorf("publish %d events (%s first) to %s/%s: %w", len(es), es[0].ID(), p.pubsub, topic, fenced(res.Error))
	}
	return nil
}

// bulkEntry is e encoded for a bulk request, with its metadata: meta, and
// e's fence when lock is not "". Metadata goes on each entry: daprd hands
// request metadata to the component only beside entries that have their
// own.
func bulkEntry(e *event.Event, lock string, meta map[string]string) ([]byte, map[string]string, error) {
	body, err := e.MarshalJSON()
	if err != nil {
		return nil, nil, fmt.Errorf("encode CloudEvent %s: %w", e.ID(), err)
	}
	if lock != "" {
		if meta, err = fenceMeta(e, lock, meta); err != nil {
			return nil, nil, err
		}
	}
	return body, meta, nil
}

// capMeta is the metadata that caps a stream at MaxLen (nil: no cap).
func (p *Dapr) capMeta() map[string]string {
	if p.MaxLen > 0 {
		return maxLen(p.MaxLen)
	}
	return nil
}

// fenceMeta is meta and the fence of e (lock and e's fencing token).
func fenceMeta(e *event.Event, lock string, meta map[string]string) (map[string]string, error) {
	tok, ok := e.Extensions()[FencingExtension].(string)
	if !ok {
		return nil, fmt.Errorf("publish: fenced output %s has no %s extension", e.ID(), FencingExtension)
	}
	m := map[string]string{fenceLockKey: lock, fenceTokenKey: tok}
	for k, v := range meta {
		m[k] = v
	}
	return m, nil
}

// fenced wraps ErrFenced around err when it is daprd's fence refusing a
// request.
func fenced(err error) error {
	if strings.Contains(err.Error(), fencedReply) {
		return fmt.Errorf("%w (%w)", ErrFenced, err)
	}
	return err
}

// DefaultStreamMaxLen is STREAM_MAX_LEN's default: about 1,000,000 entries
// per stream, which holds 1,000 msg/s for about 16 minutes, four times the
// longest a message stays unacknowledged on a running worker with the
// shipped settings (docs/scaling.md, "Stream length"). At 1 KiB an entry
// that is about 1 GiB of Redis per stream at its cap.
const DefaultStreamMaxLen = 1_000_000

// MinStreamMaxLen is the smallest STREAM_MAX_LEN a node or the API takes
// (other than 0): below it a busy topic's unacknowledged entries are
// trimmed within seconds.
const MinStreamMaxLen = 10_000

// ValidateStreamMaxLen checks STREAM_MAX_LEN: 0 (no per-request cap: the
// pub/sub component's maxLenApprox applies) or at least MinStreamMaxLen.
func ValidateStreamMaxLen(n int) error {
	if n != 0 && n < MinStreamMaxLen {
		return fmt.Errorf("STREAM_MAX_LEN must be 0 (the pub/sub component's maxLenApprox applies) or at least %d entries, got %d: Redis trims the oldest entries of a capped stream even when no consumer acknowledged them (docs/scaling.md, \"Stream length\")", MinStreamMaxLen, n)
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

// PublishBatch implements Batcher (one request, one observation) when the
// observed Publisher does.
func (o observed) PublishBatch(ctx context.Context, topic string, es []*event.Event) error {
	_, err := Batch(ctx, o.Publisher, topic, es)
	o.observe(err)
	return err
}

// PublishFenced implements Fencer when the observed Publisher does (else
// it publishes as Batch, unfenced). A fence's refusal is the broker
// answering: observed as a success.
func (o observed) PublishFenced(ctx context.Context, topic, lock string, es []*event.Event) error {
	_, err := Fenced(ctx, o.Publisher, topic, lock, es)
	if errors.Is(err, ErrFenced) {
		o.observe(nil)
	} else {
		o.observe(err)
	}
	return err
}

// urlSize is about the length of u as a string (without building it).
func urlSize(u *url.URL) int {
	n := len(u.Scheme) + len(u.Opaque) + len(u.Host) + len(u.Path) + len(u.RawPath) + len(u.RawQuery) + len(u.Fragment) + len(u.RawFragment) + 8
	if u.User != nil {
		n += len(u.User.String())
	}
	return n
}

// AttributesSize is about the size of ec's attributes and extensions as
// they are published, without building them; it stops counting above
// limit. The dispatcher holds outputs to it (MaxOutputAttributeBytes),
// Coalescing sizes its requests with it.
func AttributesSize(ec *event.EventContextV1, limit int) int {
	const perAttribute = 6                                                         // quotes, colon, comma
	n := len(ec.ID) + len(ec.Type) + urlSize(&ec.Source.URL) + 5*perAttribute + 40 // specversion, time
	if ec.Subject != nil {
		n += len(*ec.Subject) + perAttribute
	}
	if ec.DataContentType != nil {
		n += len(*ec.DataContentType) + perAttribute
	}
	if ec.DataSchema != nil {
		n += urlSize(&ec.DataSchema.URL) + perAttribute
	}
	for k, v := range ec.Extensions {
		if n > limit {
			break
		}
		n += len(k) + perAttribute
		switch v := v.(type) {
		case string:
			n += len(v)
		case []byte:
			n += base64.StdEncoding.EncodedLen(len(v))
		default:
			s, _ := types.Format(v)
			n += len(s)
		}
	}
	return n
}
