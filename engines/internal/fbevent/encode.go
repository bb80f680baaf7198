// Package fbevent owns the input side of the FlatBuffers worker ABI
// (sdk/native/worker_api.fbs) that the native and WebAssembly engines
// share: a CloudEvent encoded straight into the layout the workers read.
package fbevent

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"
	"unsafe"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
)

// Attrs are the attributes of an input event, read without the copies the
// generic EventContext getters make.
type Attrs struct {
	ID, Source, Type, Spec, ContentType, Subject, Schema string
	Time                                                 time.Time
	Exts                                                 map[string]any
}

// AttrsOf reads ev's attributes.
func AttrsOf(ev *event.Event) Attrs {
	if c, ok := ev.Context.(*event.EventContextV1); ok {
		a := Attrs{ID: c.ID, Source: uriRefString(&c.Source), Type: c.Type, Spec: event.CloudEventsVersionV1, Exts: c.Extensions}
		if c.DataContentType != nil {
			a.ContentType = *c.DataContentType
		}
		if c.Subject != nil {
			a.Subject = *c.Subject
		}
		if c.DataSchema != nil {
			a.Schema = c.DataSchema.String()
		}
		if c.Time != nil {
			a.Time = c.Time.Time
		}
		return a
	}
	return Attrs{ID: ev.ID(), Source: ev.Source(), Type: ev.Type(), Spec: ev.SpecVersion(), ContentType: ev.DataContentType(),
		Subject: ev.Subject(), Schema: ev.DataSchema(), Time: ev.Time(), Exts: ev.Extensions()}
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

// Encoder turns input events into ABI v1 CloudEvent buffers. It is reused
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
type Encoder struct {
	who  string // names the engine in its errors
	buf  []byte
	exts []extKV
	tbuf []byte
}

// extKV is one input extension, formatted.
type extKV struct{ k, v string }

// NewEncoder returns an Encoder whose errors name who ("native engine").
func NewEncoder(who string) *Encoder {
	return &Encoder{who: who, buf: make([]byte, 0, 4096), exts: make([]extKV, 0, 8), tbuf: make([]byte, 0, 40)}
}

// Layout of the encoded CloudEvent (see Encoder).
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

// PutFBString writes s as a FlatBuffers string (or [ubyte]) at pos and
// returns the position after it.
func PutFBString(b []byte, pos int, s string) int {
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
func (e *Encoder) putExtensions(b []byte, pos int) int {
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
		pos = PutFBString(b, pos, x.k)
		le.PutUint32(tb[8:], uint32(pos-(t+8)))
		pos = PutFBString(b, pos, x.v)
	}
	return pos
}

// Encode writes ev as a FlatBuffers CloudEvent (root table).
func (e *Encoder) Encode(ev *event.Event) ([]byte, error) {
	a := AttrsOf(ev)
	e.exts = e.exts[:0]
	for k, v := range a.Exts {
		s, ok := v.(string)
		if !ok {
			var err error
			if s, err = types.Format(v); err != nil {
				return nil, fmt.Errorf("%s: input extension %q: %w", e.who, k, err)
			}
		}
		e.exts = append(e.exts, extKV{k, s})
	}
	e.tbuf = e.tbuf[:0]
	if !a.Time.IsZero() {
		e.tbuf = a.Time.AppendFormat(e.tbuf, time.RFC3339Nano)
	}
	data := ev.Data()
	// The fields in slot order; absent: empty (and, for data, nil).
	strs := [ceSlots]string{0: a.ID, 1: a.Source, 2: a.Type, 3: a.Spec, 4: a.ContentType, 5: a.Subject, 6: unsafe.String(unsafe.SliceData(e.tbuf), len(e.tbuf)), 9: a.Schema}
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
		return nil, fmt.Errorf("%s: the input event needs %d bytes, more than the 2 GiB the ABI can pass", e.who, total)
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
			pos = PutFBString(b, pos, s)
		case i == slotData:
			pos = PutFBString(b, pos, unsafe.String(unsafe.SliceData(data), len(data)))
		default:
			pos = e.putExtensions(b, pos)
		}
	}
	clear(e.exts) // drop the references to the event's strings
	return b, nil
}
