package native

import (
	"errors"
	"fmt"
	"github.com/virtufin/workmanager/engines/internal/fbevent"
	"time"
	"unsafe"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/virtufin/workmanager/sdk/native/abi"
)

// The codec as it was before issue 47 (flatbuffers.Builder to encode, the
// generated accessors to decode), kept for the benchmarks' before/after
// comparison in one run and as the reference the new codec is checked
// against.

// legacyEncoder is encoder before issue 47.
type legacyEncoder struct {
	b    *flatbuffers.Builder
	offs []flatbuffers.UOffsetT
	tbuf []byte
}

func newLegacyEncoder() *legacyEncoder {
	return &legacyEncoder{b: flatbuffers.NewBuilder(4096), offs: make([]flatbuffers.UOffsetT, 0, 8), tbuf: make([]byte, 0, 40)}
}

// legacyDecodeResponse is decodeResponse before issue 47 (the verifier is
// unchanged).
func legacyDecodeResponse(buf []byte, limit int) ([]event.Event, error) {
	if err := verifyResponse(buf, limit); err != nil {
		return nil, err
	}
	return legacyDecodeVerified(buf)
}

// encode is encoder.encode before issue 47.
func (e *legacyEncoder) encode(ev *event.Event) ([]byte, error) {
	a := fbevent.AttrsOf(ev)
	b := e.b
	b.Reset()
	var dataOff flatbuffers.UOffsetT
	if data := ev.Data(); data != nil {
		dataOff = b.CreateByteVector(data)
	}
	var extOff flatbuffers.UOffsetT
	if len(a.Exts) > 0 {
		e.offs = e.offs[:0]
		for k, v := range a.Exts {
			s, ok := v.(string)
			if !ok {
				var err error
				if s, err = types.Format(v); err != nil {
					return nil, fmt.Errorf("native engine: input extension %q: %w", k, err)
				}
			}
			ko := b.CreateString(k)
			vo := b.CreateString(s)
			abi.ExtensionStart(b)
			abi.ExtensionAddKey(b, ko)
			abi.ExtensionAddValue(b, vo)
			e.offs = append(e.offs, abi.ExtensionEnd(b))
		}
		abi.CloudEventStartExtensionsVector(b, len(e.offs))
		for i := len(e.offs) - 1; i >= 0; i-- {
			b.PrependUOffsetT(e.offs[i])
		}
		extOff = b.EndVector(len(e.offs))
	}
	str := func(s string) flatbuffers.UOffsetT {
		if s == "" {
			return 0
		}
		return b.CreateString(s)
	}
	id := str(a.ID)
	source := str(a.Source)
	typ := str(a.Type)
	spec := str(a.Spec)
	ct := str(a.ContentType)
	subject := str(a.Subject)
	schema := str(a.Schema)
	var tm flatbuffers.UOffsetT
	if !a.Time.IsZero() {
		e.tbuf = a.Time.AppendFormat(e.tbuf[:0], time.RFC3339Nano)
		tm = b.CreateByteString(e.tbuf)
	}
	abi.CloudEventStart(b)
	add := func(f func(*flatbuffers.Builder, flatbuffers.UOffsetT), o flatbuffers.UOffsetT) {
		if o != 0 {
			f(b, o)
		}
	}
	add(abi.CloudEventAddId, id)
	add(abi.CloudEventAddSource, source)
	add(abi.CloudEventAddType, typ)
	add(abi.CloudEventAddSpecversion, spec)
	add(abi.CloudEventAddDatacontenttype, ct)
	add(abi.CloudEventAddSubject, subject)
	add(abi.CloudEventAddTime, tm)
	add(abi.CloudEventAddData, dataOff)
	add(abi.CloudEventAddExtensions, extOff)
	add(abi.CloudEventAddDataschema, schema)
	b.Finish(abi.CloudEventEnd(b))
	return b.FinishedBytes(), nil
}

// legacyDecodeVerified is decodeVerified before issue 47.
func legacyDecodeVerified(buf []byte) ([]event.Event, error) {
	r := abi.GetRootAsWorkerResponse(buf, 0)
	if msg := r.ErrorMessage(); msg != nil {
		m := string(msg)
		if m == "" {
			m = "the worker reported a failure with an empty error_message"
		}
		return nil, &WorkerError{Message: m}
	}
	var ce abi.CloudEvent
	n := r.ResultEventsLength()
	single := r.ResultEvent(&ce) != nil
	if single {
		n++
	}
	if n == 0 {
		return nil, nil
	}
	out := make([]event.Event, 0, n)
	if single {
		ev, err := legacyDecodeEvent(&ce)
		if err != nil {
			return nil, outputError(0, err)
		}
		out = append(out, ev)
	}
	for j := 0; j < r.ResultEventsLength(); j++ {
		if !r.ResultEvents(&ce, j) {
			return nil, outputError(len(out), fmt.Errorf("missing event"))
		}
		ev, err := legacyDecodeEvent(&ce)
		if err != nil {
			return nil, outputError(len(out), err)
		}
		out = append(out, ev)
	}
	return out, nil
}

// legacyDecodeEvent is decodeEvent before issue 47.
func legacyDecodeEvent(ce *abi.CloudEvent) (event.Event, error) {
	typ := ce.Type()
	if len(typ) == 0 {
		return event.Event{}, fmt.Errorf(`missing required attribute "type"`)
	}
	var c event.EventContext
	var dataCopy []byte
	switch sv := string(ce.Specversion()); sv {
	case "", event.CloudEventsVersionV1:
		// Built directly, with every string and the data copied into one
		// allocation: the setters cost an allocation or two each.
		id, ct, subject, data := ce.Id(), ce.Datacontenttype(), ce.Subject(), ce.DataBytes()
		slab := make([]byte, len(id)+len(typ)+len(ct)+len(subject)+len(data))
		off := 0
		str := func(b []byte) string {
			if len(b) == 0 {
				return ""
			}
			copy(slab[off:], b)
			s := unsafe.String(&slab[off], len(b))
			off += len(b)
			return s
		}
		box := &v1Box{ctx: event.EventContextV1{ID: str(id), Type: str(typ)}}
		c1 := &box.ctx
		if len(ct) > 0 {
			box.ct = str(ct)
			c1.DataContentType = &box.ct
		}
		if len(subject) > 0 {
			box.subject = str(subject)
			c1.Subject = &box.subject
		}
		if data != nil {
			// Last, and capped: appending to DataEncoded reallocates
			// instead of overwriting the strings.
			copy(slab[off:], data)
			dataCopy = slab[off : off+len(data) : off+len(data)]
		}
		c = c1
		if v := ce.Source(); len(v) > 0 {
			if err := c.SetSource(string(v)); err != nil {
				return event.Event{}, fmt.Errorf("source %s: %w", quoteShort(v), urlCause(err))
			}
		}
	case event.CloudEventsVersionV03:
		c = &event.EventContextV03{}
		c.SetID(string(ce.Id()))
		c.SetType(string(typ))
		if v := ce.Source(); len(v) > 0 {
			if err := c.SetSource(string(v)); err != nil {
				return event.Event{}, fmt.Errorf("source %s: %w", quoteShort(v), urlCause(err))
			}
		}
		if v := ce.Subject(); len(v) > 0 {
			c.SetSubject(string(v))
		}
		if v := ce.Datacontenttype(); len(v) > 0 {
			c.SetDataContentType(string(v))
		}
		if data := ce.DataBytes(); data != nil {
			dataCopy = append([]byte{}, data...)
		}
	default:
		return event.Event{}, fmt.Errorf("specversion %s is not supported", quoteShort(ce.Specversion()))
	}
	ev := event.Event{Context: c, DataEncoded: dataCopy}
	if v := ce.Dataschema(); len(v) > 0 {
		if err := c.SetDataSchema(string(v)); err != nil {
			return ev, fmt.Errorf("dataschema %s: %w", quoteShort(v), urlCause(err))
		}
	}
	if v := ce.Time(); len(v) > 0 {
		// Longer than any RFC 3339 time: refused without parsing (whose
		// error would copy it).
		var t time.Time
		err := errors.New("too long")
		if len(v) <= maxQuoted {
			t, err = time.Parse(time.RFC3339Nano, string(v))
		}
		if err != nil {
			return ev, fmt.Errorf("time %s is not RFC 3339", quoteShort(v))
		}
		if err := c.SetTime(t); err != nil {
			return ev, err
		}
	}
	var x abi.Extension
	if n := ce.ExtensionsLength(); n > 0 {
		// Sized once: growing the map entry by entry allocates about
		// twice as much.
		switch c := c.(type) {
		case *event.EventContextV1:
			c.Extensions = make(map[string]any, n)
		case *event.EventContextV03:
			c.Extensions = make(map[string]any, n)
		}
	}
	for j := 0; j < ce.ExtensionsLength(); j++ {
		if !ce.Extensions(&x, j) {
			return ev, fmt.Errorf("extension %d is missing", j)
		}
		kb := x.Key()
		if err := c.SetExtension(string(kb), string(x.Value())); err != nil {
			return ev, fmt.Errorf("extension %s: %w", quoteShort(kb), err)
		}
	}
	return ev, nil
}
