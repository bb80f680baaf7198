package wasm

import (
	"errors"
	"fmt"
	"github.com/virtufin/workmanager/engines/internal/fbevent"
	"strconv"
	"time"
	"unsafe"

	"github.com/cloudevents/sdk-go/v2/event"
	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/sdk/native/abi"
)

// The messages are those of the native engine (sdk/native/worker_api.fbs):
// the input is encoded by the native engine's encoder (ported: it is
// unexported there), which TestEncoderMatchesTheBuilder checks against
// flatbuffers.Builder and the flatc-generated package sdk/native/abi,
// through which the response is read.

// encoder is the ABI's input encoder (engines/internal/fbevent), shared
// with the native engine.
type encoder struct{ *fbevent.Encoder }

func newEncoder() *encoder { return &encoder{fbevent.NewEncoder("wasm engine")} }

// encode writes ev as a FlatBuffers CloudEvent; the bytes are valid until
// the next encode.
func (e *encoder) encode(ev *event.Event) ([]byte, error) { return e.Encode(ev) }

// Decoding cost charged per output and per extension beyond their bytes
// (the event, its context and map entries): with the bytes copied, what
// decoding a response may allocate is bounded by the reply limit, however
// often the response refers to one shared object.
const (
	costEvent     = 512
	costExtension = 192
)

// decoder reads a WorkerResponse in place (in the module's linear memory)
// and copies out what the outputs keep.
type decoder struct {
	buf   []byte
	cost  int64
	limit int64
}

// errOverLimit is what charge panics with when decoding would allocate
// more than the limit.
type errOverLimit struct{ cost int64 }

func (d *decoder) charge(n int) {
	d.cost += int64(n)
	if d.limit > 0 && d.cost > d.limit {
		panic(errOverLimit{d.cost})
	}
}

// decodeResponse turns a WorkerResponse buffer into output events, or the
// worker's error. The buffer is untrusted: every read is bounds-checked
// (a forged offset fails the call as a malformed response, never reads
// outside buf), and what decoding allocates is charged against limit
// (<= 0: none), so a small buffer cannot make the node allocate more.
func decodeResponse(buf []byte, limit int) (out []event.Event, err error) {
	if len(buf) < 8 {
		return nil, &WorkerError{Message: fmt.Sprintf("malformed response: %d bytes", len(buf))}
	}
	if limit > 0 && len(buf) > limit {
		return nil, engines.ReplyTooLarge("the worker's response", int64(len(buf)), limit)
	}
	d := &decoder{buf: buf, limit: int64(limit)}
	defer func() {
		if r := recover(); r != nil {
			if ol, ok := r.(errOverLimit); ok {
				out, err = nil, engines.ReplyTooLarge(fmt.Sprintf("decoding the worker's response (%d bytes) would allocate %d bytes, which", len(buf), ol.cost), -1, limit)
				return
			}
			out, err = nil, &WorkerError{Message: fmt.Sprintf("malformed response (%d bytes): %v", len(buf), r)}
		}
	}()
	if root := int(flatbuffers.GetUOffsetT(buf)); root < 4 || root > len(buf)-4 {
		return nil, &WorkerError{Message: fmt.Sprintf("malformed response (%d bytes): root offset %d is outside it", len(buf), root)}
	}
	r := abi.GetRootAsWorkerResponse(buf, 0)
	// error_message (with return code 0: withCode) is the worker's own
	// error answer, as the native ABI's: its outputs are its error
	// response (engines.ErrorAnswer).
	var answer *engines.ErrorAnswer
	if msg := r.ErrorMessage(); msg != nil {
		m := string(msg)
		if m == "" {
			m = "the worker reported a failure with an empty error_message"
		}
		answer = &engines.ErrorAnswer{Message: m}
		defer func() {
			if err == nil {
				answer.Outputs, out, err = out, nil, answer
			}
		}()
	}
	var ce abi.CloudEvent
	if first := r.ResultEvent(&ce); first != nil {
		ev, err := d.event(first)
		if err != nil {
			return nil, outputError(0, err)
		}
		out = append(out, ev)
	}
	n := r.ResultEventsLength()
	if n > len(buf)/4 {
		return nil, &WorkerError{Message: fmt.Sprintf("malformed response (%d bytes): result_events claims %d elements", len(buf), n)}
	}
	for j := range n {
		if !r.ResultEvents(&ce, j) {
			break
		}
		ev, err := d.event(&ce)
		if err != nil {
			return nil, outputError(len(out), err)
		}
		out = append(out, ev)
	}
	return out, nil
}

func outputError(i int, err error) error {
	return &WorkerError{Message: engines.OutputError(i, err), InvalidOutput: true}
}

// event copies one output event. Outputs need a type; id and source may
// be empty (the dispatcher fills them in).
func (d *decoder) event(ce *abi.CloudEvent) (event.Event, error) {
	d.charge(costEvent)
	typ := ce.Type()
	if len(typ) == 0 {
		return event.Event{}, errors.New(`missing required attribute "type"`)
	}
	var c event.EventContext
	var data []byte
	s := func(b []byte) string { d.charge(len(b)); return string(b) }
	switch sv := string(ce.Specversion()); sv {
	case "", event.CloudEventsVersionV1:
		// Built directly, as the native engine does: the data and every
		// string in one allocation, the context and its pointer fields'
		// strings in another (the setters cost an allocation or two each).
		id, ct, subject, raw := ce.Id(), ce.Datacontenttype(), ce.Subject(), ce.DataBytes()
		n := len(raw) + len(id) + len(typ) + len(ct) + len(subject)
		d.charge(n)
		slab := make([]byte, n)
		copy(slab, raw)
		if raw != nil {
			data = slab[:len(raw):len(raw)]
		}
		off := len(raw)
		str := func(b []byte) string {
			if len(b) == 0 {
				return ""
			}
			copy(slab[off:], b)
			v := unsafe.String(&slab[off], len(b))
			off += len(b)
			return v
		}
		box := new(v1Box)
		c1 := &box.ctx
		c1.ID, c1.Type = str(id), str(typ)
		if len(ct) > 0 {
			box.ct = str(ct)
			c1.DataContentType = &box.ct
		}
		if len(subject) > 0 {
			box.subject = str(subject)
			c1.Subject = &box.subject
		}
		c = c1
	case event.CloudEventsVersionV03:
		c = &event.EventContextV03{}
		c.SetID(s(ce.Id()))
		c.SetType(s(typ))
		if v := ce.Subject(); len(v) > 0 {
			c.SetSubject(s(v))
		}
		if v := ce.Datacontenttype(); len(v) > 0 {
			c.SetDataContentType(s(v))
		}
		if raw := ce.DataBytes(); raw != nil {
			d.charge(len(raw))
			data = append(make([]byte, 0, len(raw)), raw...)
		}
	default:
		return event.Event{}, fmt.Errorf("specversion %s is not supported", quoteShort(ce.Specversion()))
	}
	if v := ce.Source(); len(v) > 0 {
		d.charge(4 * len(v))
		if err := c.SetSource(string(v)); err != nil {
			return event.Event{}, fmt.Errorf("source %s: %w", quoteShort(v), err)
		}
	}
	if v := ce.Dataschema(); len(v) > 0 {
		d.charge(4 * len(v))
		if err := c.SetDataSchema(string(v)); err != nil {
			return event.Event{}, fmt.Errorf("dataschema %s: %w", quoteShort(v), err)
		}
	}
	if v := ce.Time(); len(v) > 0 {
		if len(v) > maxQuoted {
			return event.Event{}, fmt.Errorf("time %s is not RFC 3339", quoteShort(v))
		}
		t, err := time.Parse(time.RFC3339Nano, string(v))
		if err != nil {
			return event.Event{}, fmt.Errorf("time %s is not RFC 3339", quoteShort(v))
		}
		if err := c.SetTime(t); err != nil {
			return event.Event{}, err
		}
	}
	ev := event.Event{Context: c, DataEncoded: data}
	n := ce.ExtensionsLength()
	if n > len(d.buf)/4 {
		return ev, fmt.Errorf("extensions: vector of %d elements does not fit the response", n)
	}
	if n > 0 {
		// Sized once (growing it entry by entry allocates twice as much).
		switch c := c.(type) {
		case *event.EventContextV1:
			c.Extensions = make(map[string]any, n)
		case *event.EventContextV03:
			c.Extensions = make(map[string]any, n)
		}
	}
	var x abi.Extension
	for j := range n {
		d.charge(costExtension)
		if !ce.Extensions(&x, j) {
			break
		}
		k := x.Key()
		if err := c.SetExtension(s(k), s(x.Value())); err != nil {
			return ev, fmt.Errorf("extension %s: %w", quoteShort(k), err)
		}
	}
	return ev, nil
}

// v1Box holds an output's context and the strings its pointer fields
// point to, in one allocation.
type v1Box struct {
	ctx         event.EventContextV1
	ct, subject string
}

// maxQuoted bounds how much of a worker's attribute an error quotes.
const maxQuoted = 64

// quoteShort quotes at most maxQuoted bytes of b.
func quoteShort(b []byte) string {
	if len(b) <= maxQuoted {
		return strconv.Quote(string(b))
	}
	return strconv.Quote(string(b[:maxQuoted])) + fmt.Sprintf("... (%d bytes)", len(b))
}
