package wasm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
	"unsafe"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/sdk/native/abi"
)

// The messages are those of the native engine (sdk/native/worker_api.fbs):
// the input is encoded by the native engine's encoder (ported: it is
// unexported there), which TestEncoderMatchesTheBuilder checks against
// flatbuffers.Builder and the flatc-generated package sdk/native/abi,
// through which the response is read.

// attrs are the attributes of an input event, read without the copies the
// generic EventContext getters make.
type attrs struct {
	id, source, typ, spec, ct, subject, schema string
	tm                                         time.Time
	exts                                       map[string]any
}

func attrsOf(ev *event.Event) attrs {
	if c, ok := ev.Context.(*event.EventContextV1); ok {
		a := attrs{id: c.ID, source: uriRefString(&c.Source), typ: c.Type, spec: event.CloudEventsVersionV1, exts: c.Extensions}
		if c.DataContentType != nil {
			a.ct = *c.DataContentType
		}
		if c.Subject != nil {
			a.subject = *c.Subject
		}
		if c.DataSchema != nil {
			a.schema = c.DataSchema.String()
		}
		if c.Time != nil {
			a.tm = c.Time.Time
		}
		return a
	}
	return attrs{id: ev.ID(), source: ev.Source(), typ: ev.Type(), spec: ev.SpecVersion(), ct: ev.DataContentType(),
		subject: ev.Subject(), schema: ev.DataSchema(), tm: ev.Time(), exts: ev.Extensions()}
}

// uriRefString is u.String() without its allocation for the usual source
// made of a plain path ("/orders").
func uriRefString(u *types.URIRef) string {
	if u.Scheme == "" && u.Opaque == "" && u.User == nil && u.Host == "" && u.RawPath == "" &&
		u.RawQuery == "" && u.Fragment == "" && !u.ForceQuery && plainPath(u.Path) {
		return u.Path
	}
	return u.String()
}

// plainPath reports whether p needs no escaping and cannot be mistaken for
// a scheme ("a:b").
func plainPath(p string) bool {
	for i := 0; i < len(p); i++ {
		c := p[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '/' || c == '-' || c == '_' || c == '.' || c == '~') {
			return false
		}
	}
	return true
}

// encoder turns input events into ABI v1 CloudEvent buffers, exactly as
// the native engine's encoder does (this is its code: engines/native/codec.go).
// One per module instance (one call at a time); the bytes it returns are
// valid until the next encode.
//
// It writes the FlatBuffers layout directly, front to back, instead of
// going through flatbuffers.Builder (whose per-scalar bookkeeping was most
// of the encoding time): the root offset, the CloudEvent vtable (all ten
// slots), the Extension vtable shared by every extension, the CloudEvent
// table, then each string and vector the table refers to, the extension
// tables and their strings. Every object starts 4-byte aligned, strings
// are NUL-terminated, and every offset points forward, so any FlatBuffers
// verifier accepts it (TestEncodedEventsPassTheFlatBuffersVerifier).
type encoder struct {
	buf  []byte
	exts []extKV
	tbuf []byte
}

// extKV is one input extension, formatted.
type extKV struct{ k, v string }

func newEncoder() *encoder {
	return &encoder{buf: make([]byte, 0, 4096), exts: make([]extKV, 0, 8), tbuf: make([]byte, 0, 40)}
}

// Layout of the encoded CloudEvent (see encoder).
const (
	ceSlots   = 10                // id .. dataschema
	ceVT      = 4                 // the CloudEvent vtable, after the root offset
	ceVTSize  = 4 + 2*ceSlots     // 24
	extVT     = ceVT + ceVTSize   // the Extension vtable
	extVTSize = 8                 // two slots
	extTSize  = 12                // soffset, key, value
	ceTable   = extVT + extVTSize // the CloudEvent table
)

// fbBytesSize is the size of a string or [ubyte] of n bytes: its length,
// the bytes, the NUL a string ends with (a byte vector gets it too, as
// padding), up to a multiple of 4.
func fbBytesSize(n int) int { return (4 + n + 1 + 3) &^ 3 }

// putFBString writes s as a FlatBuffers string (or [ubyte]) at pos and
// returns the position after it.
func putFBString(b []byte, pos int, s string) int {
	d := b[pos : pos+fbBytesSize(len(s))]
	binary.LittleEndian.PutUint32(d, uint32(len(s)))
	n := 4 + copy(d[4:], s)
	for ; n < len(d); n++ {
		d[n] = 0 // the NUL and the padding
	}
	return pos + len(d)
}

// putExtensions writes the extensions vector at pos, then the extension
// tables and their strings, and returns the position after them.
func (e *encoder) putExtensions(b []byte, pos int) int {
	le := binary.LittleEndian
	n := len(e.exts)
	le.PutUint32(b[pos:], uint32(n))
	vec := pos + 4
	tables := vec + 4*n
	pos = tables + extTSize*n
	for j, x := range e.exts {
		el, t := vec+4*j, tables+extTSize*j
		le.PutUint32(b[el:], uint32(t-el))
		tb := b[t : t+extTSize]
		le.PutUint32(tb, uint32(t-extVT))
		le.PutUint32(tb[4:], uint32(pos-(t+4)))
		pos = putFBString(b, pos, x.k)
		le.PutUint32(tb[8:], uint32(pos-(t+8)))
		pos = putFBString(b, pos, x.v)
	}
	return pos
}

// encode writes ev as a FlatBuffers CloudEvent (root table).
func (e *encoder) encode(ev *event.Event) ([]byte, error) {
	a := attrsOf(ev)
	e.exts = e.exts[:0]
	for k, v := range a.exts {
		s, ok := v.(string)
		if !ok {
			var err error
			if s, err = types.Format(v); err != nil {
				return nil, fmt.Errorf("wasm engine: input extension %q: %w", k, err)
			}
		}
		e.exts = append(e.exts, extKV{k, s})
	}
	e.tbuf = e.tbuf[:0]
	if !a.tm.IsZero() {
		e.tbuf = a.tm.AppendFormat(e.tbuf, time.RFC3339Nano)
	}
	data := ev.Data()
	// The fields in slot order; absent: empty (and, for data, nil).
	strs := [ceSlots]string{0: a.id, 1: a.source, 2: a.typ, 3: a.spec, 4: a.ct, 5: a.subject, 6: unsafe.String(unsafe.SliceData(e.tbuf), len(e.tbuf)), 9: a.schema}
	const slotData, slotExts = 7, 8
	// The size, in 64 bits (a sum of lengths may not fit an int on
	// 32-bit platforms); every position below fits in an int32.
	fields, total := 0, int64(0)
	bytesSize := func(n int) int64 { return (4 + int64(n) + 1 + 3) &^ 3 }
	for i, s := range strs {
		if s != "" {
			fields++
			total += bytesSize(len(s))
		} else if i == slotData && data != nil {
			fields++
			total += bytesSize(len(data))
		} else if i == slotExts && len(e.exts) > 0 {
			fields++
			total += 4 + 4*int64(len(e.exts))
			for _, x := range e.exts {
				total += extTSize + bytesSize(len(x.k)) + bytesSize(len(x.v))
			}
		}
	}
	tsize := 4 + 4*fields
	total += int64(ceTable + tsize)
	if total > math.MaxInt32 {
		return nil, fmt.Errorf("wasm engine: the input event needs %d bytes, more than the 2 GiB the ABI can pass", total)
	}
	size := int(total)
	if cap(e.buf) < size {
		e.buf = make([]byte, size)
	}
	b := e.buf[:size]
	le := binary.LittleEndian
	h := b[:ceTable+4]
	le.PutUint32(h[0:], ceTable)
	le.PutUint16(h[ceVT:], ceVTSize)
	le.PutUint16(h[ceVT+2:], uint16(tsize))
	le.PutUint16(h[extVT:], extVTSize)
	le.PutUint16(h[extVT+2:], extTSize)
	le.PutUint16(h[extVT+4:], 4)
	le.PutUint16(h[extVT+6:], 8)
	le.PutUint32(h[ceTable:], ceTable-ceVT) // soffset: table - vtable
	slots := h[ceVT+4 : ceVT+4+2*ceSlots]
	pos := ceTable + tsize // next free byte
	field := ceTable + 4   // next field of the table
	for i, s := range strs {
		present := s != "" || i == slotData && data != nil || i == slotExts && len(e.exts) > 0
		if !present {
			le.PutUint16(slots[2*i:], 0)
			continue
		}
		// The field refers to what is written at pos.
		le.PutUint16(slots[2*i:], uint16(field-ceTable))
		le.PutUint32(b[field:], uint32(pos-field))
		field += 4
		switch {
		case s != "":
			pos = putFBString(b, pos, s)
		case i == slotData:
			pos = putFBString(b, pos, unsafe.String(unsafe.SliceData(data), len(data)))
		default:
			pos = e.putExtensions(b, pos)
		}
	}
	clear(e.exts) // drop the references to the event's strings
	return b, nil
}

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
