package dispatch

// Stage 1 of a message: receive and decode. A message taken off its
// topic's stream (stream.go) is matched against the deliveries in flight,
// checked against the input bounds and decoded; then it goes to its
// delivery record (record.go), or, when it cannot be processed at all,
// straight to its dead letter (settle.go).

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/delivery"
)

// message is one received event on its way through the workers of a topic.
type message struct {
	t      *topic
	id     string
	req    *runtimev1.TopicEventRequest
	stream Stream // where its answer goes: a redelivery on a newer stream moves it there (guarded by t.mu)
	ev     event.Event
	ec     event.EventContextV1
	key    string // delivery record
	srcTag string // sourceTag
	// replayFor, when set, is the only worker this event is for (a replayed
	// dead letter); replaySig signs it (deadletter.ReplaySignatureExtension).
	// record honours the marker only with a valid signature.
	replayFor, replaySig string
	// correlation is the input's correlation id (hasCorrelation: present).
	correlation    any
	hasCorrelation bool

	dups int // further deliveries of it while in flight (guarded by t.mu)
	// next is another event with the same id (another source) delivered
	// while this one was in flight, held until this one is settled; and
	// superseded says that daprd, whose streaming subscription keys its
	// pending answers by event id, now waits for next's answer under this
	// id, not for this one's: this one's answer must not be sent (it would
	// settle next unrun); the broker redelivers it after its processing
	// timeout, and its delivery record answers that redelivery. Both
	// guarded by t.mu.
	next       *message
	superseded bool

	// The delivery record's stage (record.go) fills these: rec is the
	// record as read, results one per worker the message is for on this
	// delivery, and pending counts the stages still holding the message
	// (the record stage and each job queued): the last to let go settles
	// it (settle.go). abort: a panic in the record stage; the message is
	// given back unsaved.
	rec     delivery.Record
	results []result
	pending atomic.Int32
	abort   bool
	// replayGone: a replay for a worker no longer running on the topic; it
	// goes back to the dead letters (settle.go).
	replayGone error
	// now is when its record was read (the time its attempts are judged
	// by).
	now time.Time

	// remote, for a turn a peer forwarded here (forward.go), is closed when
	// the turn ended: the message has no stream, record or settling here.
	remote chan struct{}

	// started is when the node began handling it, decoded (mono); ended,
	// when set, when its record was written, i.e. its handling ended
	// (mono; one clock read less for the ack).
	started, ended int64
}

// monoBase anchors mono: the hot path keeps its timestamps as int64
// nanoseconds of the monotonic clock, 8 bytes where a time.Time takes 24
// (message and result stay in their allocation size classes).
var monoBase = time.Now()

// mono is now as nanoseconds since monoBase; monoOf is t's.
func mono() int64 { return int64(time.Since(monoBase)) }

func monoOf(t time.Time) int64 { return int64(t.Sub(monoBase)) }

// seconds is the time between two mono readings, in seconds.
func seconds(from, to int64) float64 { return float64(to-from) / 1e9 }

// isFor reports whether the message is for worker id (every worker, unless
// it is a replay for one).
func (m *message) isFor(id string) bool { return m.replayFor == "" || m.replayFor == id }

// receive takes one message off the stream (the topic's stream goroutine):
// it recognises deliveries of an event already in flight, dead-letters
// what cannot be processed at all, and hands the rest to record.
//
// daprd answers a streaming subscription's events by id: a delivery of an
// id in flight here replaces the one daprd waits for. A redelivery of the
// same event (same source and id) is answered together with it (never run
// twice at once). Another event with the same id (another source: a
// different CloudEvent) is held until the one in flight is settled, then
// runs and is the one answered; see message.next. An event without an id
// (undecodable: dead-lettered) is never matched with another.
func (d *Dispatcher) receive(t *topic, st Stream, req *runtimev1.TopicEventRequest) {
	id := req.GetId()
	// Counted before draining is checked, and Drain sets draining before it
	// reads the count: a message is either given back or waited for. The
	// same holds for a topic whose last worker left (closeTopic).
	d.flight(t, 1)
	if d.draining.Load() || t.closing.Load() {
		d.flight(t, -1)
		d.ackRaw(st, id, AckRetry) // shutting down, or the topic left this node: another node takes it
		return
	}
	m := &message{t: t, id: id, req: req, stream: st}
	t.mu.Lock()
	if cur := t.inflight[id]; cur != nil && id != "" {
		last := cur
		if cur.next != nil {
			last = cur.next
		}
		if last.req.GetSource() == req.GetSource() {
			// The same event again: answer this delivery together with
			// the one in flight instead of running the event twice at once.
			// A delivery on another stream (the subscription reconnected)
			// is answered there: the old stream is closed, and daprd forgot
			// what it delivered on it.
			if last.stream != st {
				last.stream, last.dups = st, 0
			} else {
				last.dups++
			}
			t.mu.Unlock()
			d.flight(t, -1)
			d.stats.duplicates.Add(1)
			d.log.Info("event delivered again while in flight; both deliveries are answered together", "topic", t.name, "event_id", logID(id))
			return
		}
		// Another event with this id: daprd now waits for its answer
		// only. It runs once the one in flight is settled.
		cur.superseded = true
		dropped := cur.next // never started, and no longer awaited by daprd: redelivered later
		cur.next = m
		t.mu.Unlock()
		if dropped != nil {
			d.flight(t, -1)
		}
		d.log.Info("another event with the id of one in flight (other source): held until that one is settled", "topic", t.name,
			"event_id", logID(id), "source", logID(req.GetSource()), "in_flight_source", logID(cur.req.GetSource()))
		return
	}
	if id != "" {
		t.inflight[id] = m
	}
	t.mu.Unlock()
	d.start(m, &t.sources)
}

// start dead-letters m when it is too large or cannot be decoded, and
// hands it to its delivery record otherwise. sources is the topic's source
// cache when called on its stream goroutine, nil elsewhere.
func (d *Dispatcher) start(m *message, sources *sourceCache) {
	if reason, err := d.admit(m, sources); err != nil {
		go d.reject(m, reason, err)
		return
	}
	go d.record(m)
}

// admit checks m's request against the input bounds and decodes it: the
// error says why it cannot be processed at all, with the reason of its
// dead letter. A turn forwarded by a peer (forward.go) is checked the same.
func (d *Dispatcher) admit(m *message, sources *sourceCache) (deadletter.Reason, error) {
	if n := len(m.req.GetData()); n > d.cfg.MaxEventBytes {
		return deadletter.ReasonTooLarge, fmt.Errorf("event data is %d bytes, more than MAX_EVENT_BYTES %d", n, d.cfg.MaxEventBytes)
	}
	if err := checkInputAttributes(m.req); err != nil {
		return deadletter.ReasonTooLarge, err
	}
	if err := d.decode(m, sources); err != nil {
		return deadletter.ReasonUndecodable, err
	}
	return "", nil
}

// decode fills m from its request; a panic while decoding is an error.
func (d *Dispatcher) decode(m *message, sources *sourceCache) (err error) {
	defer func() {
		if p := recover(); p != nil {
			d.stats.panics.Add(1)
			d.log.Error("panic while decoding an event", "topic", m.t.name, "event_id", m.id, "panic", p, "stack", string(debug.Stack()))
			err = fmt.Errorf("decoding panicked: %v", p)
		}
	}()
	if err := decode(m.req, &m.ev, &m.ec, sources); err != nil {
		return err
	}
	ext := m.ec.Extensions
	m.correlation, m.hasCorrelation = ext[CorrelationExtension]
	if r, ok := ext[deadletter.ReplayExtension].(string); ok {
		m.replayFor = r
		m.replaySig, _ = ext[deadletter.ReplaySignatureExtension].(string)
	}
	// Workers see the event as first published.
	delete(ext, deadletter.ReplayExtension)
	delete(ext, deadletter.ReplaySignatureExtension)
	m.key = delivery.Key(m.req.GetSource(), m.id)
	m.srcTag = sourceTag(m.req.GetSource())
	return nil
}

// Bounds of an input's attributes (all but its data), checked before
// anything reads them: a worker copies the input's id (into its outputs'
// ids), its correlation id and trace state into every output, so an
// unbounded attribute would be multiplied by MAX_OUTPUTS_PER_MESSAGE. An
// input over them is dead-lettered at once, reason too_large.
const (
	// MaxInputIDBytes bounds an input's id.
	MaxInputIDBytes = 1 << 10
	// MaxInputAttributeBytes bounds an input's attributes and extensions
	// together (id, source, type, content type, each extension's name and
	// value).
	MaxInputAttributeBytes = 8 << 10
	// maxPlainOutputID: an input id up to this long is used as it is in
	// its outputs' default ids, a longer one by its hash.
	maxPlainOutputID = 64
)

// checkInputAttributes says why req's attributes are over the bounds
// above (nil: they are not).
func checkInputAttributes(req *runtimev1.TopicEventRequest) error {
	if n := len(req.GetId()); n > MaxInputIDBytes {
		return fmt.Errorf("the event's id is %d bytes, more than %d", n, MaxInputIDBytes)
	}
	n := len(req.GetId()) + len(req.GetSource()) + len(req.GetType()) + len(req.GetSpecVersion()) + len(req.GetDataContentType())
	for k, v := range req.GetExtensions().GetFields() {
		if n > MaxInputAttributeBytes {
			break
		}
		n += len(k) + valueSize(v)
	}
	if n > MaxInputAttributeBytes {
		return fmt.Errorf("the event's attributes and extensions take %d bytes or more, more than %d", n, MaxInputAttributeBytes)
	}
	return nil
}

// valueSize is about the size of an extension's value as it is published.
func valueSize(v *structpb.Value) int {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return len(k.StringValue)
	case *structpb.Value_StructValue, *structpb.Value_ListValue:
		return proto.Size(v)
	default:
		return 8
	}
}

// outputIDBase is the part of an output's default id that names its
// input: the input's id when it is short, else a hash of it (the same for
// every delivery: deduplication downstream relies on output ids).
func outputIDBase(id string) string {
	if len(id) <= maxPlainOutputID {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "sha256:" + hex.EncodeToString(sum[:16])
}

// logID is an event id as it is logged: an id from a message that was not
// checked yet may be of any size.
func logID(id string) string {
	if len(id) <= 2*maxPlainOutputID {
		return id
	}
	return id[:maxPlainOutputID] + "... (" + outputIDBase(id) + ")"
}

// sourceCache remembers the last parsed source: the events of one topic
// usually share it, and parsing a URI reference is the costliest step of
// decoding. Not safe for concurrent use (one per topic stream goroutine).
type sourceCache struct {
	raw    string
	parsed types.URIRef
}

func (c *sourceCache) get(raw string) (types.URIRef, error) {
	if c != nil && c.raw == raw && raw != "" {
		return c.parsed, nil
	}
	p := types.ParseURIRef(raw)
	if p == nil {
		return types.URIRef{}, fmt.Errorf("source %q is not a URI reference", raw)
	}
	if c != nil {
		c.raw, c.parsed = raw, *p
	}
	return *p, nil
}

// Decode turns a Dapr TopicEventRequest into a CloudEvent v1.0, keeping its
// extensions (correlationid, traceparent, ...). Data and the content type are
// shared with req, not copied.
func Decode(req *runtimev1.TopicEventRequest, e *event.Event) error {
	return decode(req, e, new(event.EventContextV1), nil)
}

// decode fills e with ec as its context (so a pooled message can reuse both).
func decode(req *runtimev1.TopicEventRequest, e *event.Event, ec *event.EventContextV1, sources *sourceCache) error {
	if sv := req.GetSpecVersion(); sv != "" && sv != event.CloudEventsVersionV1 {
		return fmt.Errorf("CloudEvent %q: unsupported specversion %q", req.GetId(), sv)
	}
	if req.GetId() == "" || req.GetType() == "" || req.GetSource() == "" {
		return fmt.Errorf("CloudEvent %q: id, source and type are required (source %q, type %q)", req.GetId(), req.GetSource(), req.GetType())
	}
	src, err := sources.get(req.GetSource())
	if err != nil {
		return fmt.Errorf("CloudEvent %q: %w", req.GetId(), err)
	}
	ext := ec.Extensions // a pooled context keeps its (cleared) map
	clear(ext)
	*ec = event.EventContextV1{ID: req.Id, Type: req.Type, Source: src}
	if req.DataContentType != "" {
		ec.DataContentType = &req.DataContentType
	}
	if fields := req.GetExtensions().GetFields(); len(fields) > 0 {
		if ext == nil {
			ext = make(map[string]any, len(fields))
		}
		ec.Extensions = ext
		for k, v := range fields {
			if err := setExtension(ec, k, v); err != nil {
				// Dapr adds a few attributes of its own; one that cannot be
				// carried is dropped rather than failing the message.
				continue
			}
		}
	}
	*e = event.Event{Context: ec, DataEncoded: req.GetData()}
	return nil
}

// setExtension stores string values without the reflection and copies of
// EventContextV1.SetExtension; other kinds go through it. The optional
// context attributes Dapr passes among the extensions (subject, time,
// dataschema: TopicEventRequest has no fields for them) are set as the
// attributes they are; SetExtension refuses spec attributes, so they were
// dropped before (a worker never saw an event's subject).
func setExtension(ec *event.EventContextV1, k string, v *structpb.Value) error {
	s, isString := v.GetKind().(*structpb.Value_StringValue)
	switch {
	case isString && validExtensionName(k) && !isSpecAttribute(k):
		ec.Extensions[k] = s.StringValue
		return nil
	case k == "subject" && isString:
		if s.StringValue != "" {
			ec.Subject = &s.StringValue
		}
		return nil
	case k == "time" && isString:
		t, err := types.ParseTime(s.StringValue)
		if err != nil {
			return err
		}
		ec.Time = &types.Timestamp{Time: t}
		return nil
	case k == "dataschema" && isString:
		u := types.ParseURI(s.StringValue)
		if u == nil {
			return fmt.Errorf("dataschema %q is not a URI", s.StringValue)
		}
		ec.DataSchema = u
		return nil
	}
	return ec.SetExtension(k, v.AsInterface())
}

func validExtensionName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

func isSpecAttribute(k string) bool {
	switch k {
	case "specversion", "id", "source", "type", "datacontenttype", "dataschema", "subject", "time", "data", "data_base64":
		return true
	}
	return false
}

// sourceTag returns the part of an output's default id that tells inputs
// with one id from two sources apart (CloudEvents: source+id is the
// identity): the first 8 hex digits of the SHA-256 of the input's source.
// Without it their outputs would share source and id, and a downstream
// worker would run only one of them.
func sourceTag(source string) string {
	sum := sha256.Sum256([]byte(source))
	return hex.EncodeToString(sum[:4])
}
