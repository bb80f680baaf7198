package native

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"time"
	"unsafe"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"

	"github.com/virtufin/workmanager/engines"
)

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

// encoder turns input events into ABI v1 CloudEvent buffers. It is reused
// across calls; the bytes it returns are valid until the next encode.
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
				return nil, fmt.Errorf("native engine: input extension %q: %w", k, err)
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
		return nil, fmt.Errorf("native engine: the input event needs %d bytes, more than the 2 GiB the ABI can pass", total)
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

// decodeResponse turns a WorkerResponse buffer into output events, or the
// worker's error. The buffer is the worker's (native memory, or bytes from
// a host process): everything is copied. A malformed buffer, or one that
// is larger or would decode to more than limit bytes (<= 0: no limit),
// gives a *WorkerError, never a crash or a big allocation: verifyResponse
// checks every offset, length and count against buf before anything is
// read or allocated.
func decodeResponse(buf []byte, limit int) (out []event.Event, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, &WorkerError{Message: fmt.Sprintf("malformed response (%d bytes): %v", len(buf), r)}
		}
	}()
	if len(buf) < 8 {
		return nil, &WorkerError{Message: fmt.Sprintf("malformed response: %d bytes", len(buf))}
	}
	if limit > 0 && len(buf) > limit {
		return nil, engines.ReplyTooLarge("the worker's response", int64(len(buf)), limit)
	}
	if err := verifyResponse(buf, limit); err != nil {
		var fe *fbError
		if errors.As(err, &fe) && fe.overLimit {
			return nil, engines.ReplyTooLarge("the worker's response ("+err.Error()+")", int64(len(buf)), limit)
		}
		return nil, &WorkerError{Message: fmt.Sprintf("malformed response (%d bytes): %v", len(buf), err)}
	}
	return decodeVerified(buf)
}

// decodeVerified decodes a buffer verifyResponse accepted. The buffer is
// read where it is (native memory for an in-process worker): only what
// the outputs keep is copied out of it.
func decodeVerified(buf []byte) ([]event.Event, error) {
	r := fbTableAt(buf, int(binary.LittleEndian.Uint32(buf)))
	if msg := r.bytes(slotResponseError); msg != nil {
		// The worker's own error answer (the ABI: a worker.error event,
		// then its error response, or a default one when it gave none).
		m := string(msg)
		if m == "" {
			m = "the worker reported a failure with an empty error_message"
		}
		outs, err := decodeOutputs(buf, r)
		if err != nil {
			return nil, err
		}
		return nil, &engines.ErrorAnswer{Message: m, Outputs: outs}
	}
	return decodeOutputs(buf, r)
}

// decodeOutputs decodes the result_event and result_events of r, the
// response table.
func decodeOutputs(buf []byte, r fbTable) ([]event.Event, error) {
	first := r.ref(slotResponseEvent)
	n, start := r.vector(slotResponseEvents)
	total := n
	if first != 0 {
		total++
	}
	if total == 0 {
		return nil, nil
	}
	// The outputs and their contexts: one allocation for the usual single
	// output, two for more.
	var out []event.Event
	var boxes []v1Box
	if total == 1 {
		one := new(oneOutput)
		out, boxes = one.ev[:0], one.box[:]
	} else {
		out, boxes = make([]event.Event, 0, total), make([]v1Box, total)
	}
	if first != 0 {
		ev, err := decodeEvent(fbTableAt(buf, first), &boxes[0])
		if err != nil {
			return nil, outputError(0, err)
		}
		out = append(out, ev)
	}
	for j := range n {
		ev, err := decodeEvent(r.elem(start, j), &boxes[len(out)])
		if err != nil {
			return nil, outputError(len(out), err)
		}
		out = append(out, ev)
	}
	return out, nil
}

// fbTable reads a table of a buffer verifyResponse accepted: its vtable is
// found once, and each field is read without the checks the verifier
// made (Go's bounds checks still apply).
type fbTable struct {
	buf     []byte
	pos, vt int
	vtSize  int
}

func fbTableAt(buf []byte, pos int) fbTable {
	vt := pos - int(int32(binary.LittleEndian.Uint32(buf[pos:])))
	return fbTable{buf: buf, pos: pos, vt: vt, vtSize: int(binary.LittleEndian.Uint16(buf[vt:]))}
}

// ref is the position the offset field in slot points to, 0 when the
// field is absent (nothing is referred to at 0: offsets point forward).
func (t *fbTable) ref(slot int) int {
	if slot+2 > t.vtSize {
		return 0
	}
	off := int(binary.LittleEndian.Uint16(t.buf[t.vt+slot:]))
	if off == 0 {
		return 0
	}
	p := t.pos + off
	return p + int(binary.LittleEndian.Uint32(t.buf[p:]))
}

// bytes is the string or [ubyte] in slot, nil when it is absent.
func (t *fbTable) bytes(slot int) []byte {
	p := t.ref(slot)
	if p == 0 {
		return nil
	}
	n := int(binary.LittleEndian.Uint32(t.buf[p:]))
	return t.buf[p+4 : p+4+n : p+4+n]
}

// vector is the length of the vector in slot and its first element's
// position (0, 0 when it is absent).
func (t *fbTable) vector(slot int) (n, start int) {
	p := t.ref(slot)
	if p == 0 {
		return 0, 0
	}
	return int(binary.LittleEndian.Uint32(t.buf[p:])), p + 4
}

// elem is the table that element i of the vector of tables starting at
// start refers to.
func (t *fbTable) elem(start, i int) fbTable {
	p := start + 4*i
	return fbTableAt(t.buf, p+int(binary.LittleEndian.Uint32(t.buf[p:])))
}

// oneOutput is a single output and its context, allocated together.
type oneOutput struct {
	ev  [1]event.Event
	box [1]v1Box
}

func outputError(i int, err error) error {
	return &WorkerError{Message: engines.OutputError(i, err), InvalidOutput: true}
}

// v1Box holds an output's context and the strings its pointer fields point
// to, in one allocation.
type v1Box struct {
	ctx         event.EventContextV1
	ct, subject string
}

// decodeEvent copies one output event; a 1.0 event's context is built in
// box. Outputs need a type; id and source may be empty (the dispatcher
// fills them in).
func decodeEvent(ce fbTable, box *v1Box) (event.Event, error) {
	typ := ce.bytes(slotEventType)
	if len(typ) == 0 {
		return event.Event{}, fmt.Errorf(`missing required attribute "type"`)
	}
	var c event.EventContext
	var dataCopy []byte
	switch sv := string(ce.bytes(slotEventSpecversion)); sv {
	case "", event.CloudEventsVersionV1:
		// Built directly, with the data and every string copied into one
		// allocation: the setters cost an allocation or two each. The
		// data comes first, so that only the strings' part of the slab is
		// zeroed before it is overwritten (make and copy together), and
		// capped: appending to DataEncoded reallocates instead of
		// overwriting the strings.
		id, ct, subject, data := ce.bytes(slotEventID), ce.bytes(slotEventDatacontenttype), ce.bytes(slotEventSubject), ce.bytes(slotEventData)
		slab := make([]byte, len(data)+len(id)+len(typ)+len(ct)+len(subject))
		copy(slab, data)
		if data != nil {
			dataCopy = slab[:len(data):len(data)]
		}
		off := len(data)
		str := func(b []byte) string {
			if len(b) == 0 {
				return ""
			}
			copy(slab[off:], b)
			s := unsafe.String(&slab[off], len(b))
			off += len(b)
			return s
		}
		// The box is zeroed memory: only what is set is written (a
		// composite assignment would copy all of it).
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
		if v := ce.bytes(slotEventSource); len(v) > 0 {
			if err := c.SetSource(string(v)); err != nil {
				return event.Event{}, fmt.Errorf("source %s: %w", quoteShort(v), urlCause(err))
			}
		}
	case event.CloudEventsVersionV03:
		c = &event.EventContextV03{}
		c.SetID(string(ce.bytes(slotEventID)))
		c.SetType(string(typ))
		if v := ce.bytes(slotEventSource); len(v) > 0 {
			if err := c.SetSource(string(v)); err != nil {
				return event.Event{}, fmt.Errorf("source %s: %w", quoteShort(v), urlCause(err))
			}
		}
		if v := ce.bytes(slotEventSubject); len(v) > 0 {
			c.SetSubject(string(v))
		}
		if v := ce.bytes(slotEventDatacontenttype); len(v) > 0 {
			c.SetDataContentType(string(v))
		}
		if data := ce.bytes(slotEventData); data != nil {
			dataCopy = append([]byte{}, data...)
		}
	default:
		return event.Event{}, fmt.Errorf("specversion %s is not supported", quoteShort(ce.bytes(slotEventSpecversion)))
	}
	ev := event.Event{Context: c, DataEncoded: dataCopy}
	if v := ce.bytes(slotEventSchema); len(v) > 0 {
		if err := c.SetDataSchema(string(v)); err != nil {
			return ev, fmt.Errorf("dataschema %s: %w", quoteShort(v), urlCause(err))
		}
	}
	if v := ce.bytes(slotEventTime); len(v) > 0 {
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
	n, start := ce.vector(slotEventExtensions)
	if n > 0 {
		// Sized once: growing the map entry by entry allocates about
		// twice as much.
		switch c := c.(type) {
		case *event.EventContextV1:
			c.Extensions = make(map[string]any, n)
		case *event.EventContextV03:
			c.Extensions = make(map[string]any, n)
		}
	}
	for j := range n {
		x := ce.elem(start, j)
		kb := x.bytes(slotExtKey)
		if err := c.SetExtension(string(kb), string(x.bytes(slotExtValue))); err != nil {
			return ev, fmt.Errorf("extension %s: %w", quoteShort(kb), err)
		}
	}
	return ev, nil
}

// maxQuoted bounds how much of a worker's attribute an error quotes.
const maxQuoted = 64

// quoteShort quotes at most maxQuoted bytes of b (an error about an
// attribute of any length costs little).
func quoteShort(b []byte) string {
	if len(b) <= maxQuoted {
		return strconv.Quote(string(b))
	}
	return strconv.Quote(string(b[:maxQuoted])) + fmt.Sprintf("... (%d bytes)", len(b))
}

// urlCause is a URL parse error without the URL (url.Error quotes it
// whole).
func urlCause(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
