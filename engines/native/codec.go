package native

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/virtufin/workmanager/engines/internal/fbevent"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
)

// encoder is the ABI's input encoder (engines/internal/fbevent), shared
// with the WebAssembly engine.
type encoder struct{ *fbevent.Encoder }

func newEncoder() *encoder { return &encoder{fbevent.NewEncoder("native engine")} }

// encode writes ev as a FlatBuffers CloudEvent; the bytes are valid until
// the next encode.
func (e *encoder) encode(ev *event.Event) ([]byte, error) { return e.Encode(ev) }

// decodeResponse turns a WorkerResponse buffer into output events, or the
// worker's error. The buffer is the worker's (native memory, or bytes from
// a host process): everything is copied. A malformed buffer, or one that
// is larger or would decode to more than limit bytes (<= 0: no limit),
// gives a *WorkerError, never a crash or a big allocation: verifyResponse
// checks every offset, length and count against buf before anything is
// read or allocated.
func decodeResponse(buf []byte, limit int) ([]event.Event, error) {
	return decodeInto(buf, limit, nil)
}

// decodeLent is decodeResponse for outputs lent out of buf
// (engines.Lender): their data is not copied but points into buf, and a
// single output and its context are put in l, so buf must stay as it is
// and l unused until the outputs are returned. Their attribute strings
// are Go strings, as decodeResponse's.
func decodeLent(buf []byte, limit int, l *oneOutput) ([]event.Event, error) {
	return decodeInto(buf, limit, l)
}

func decodeInto(buf []byte, limit int, l *oneOutput) (out []event.Event, err error) {
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
	if l != nil {
		if out, ok := decodeQuick(buf, limit, l); ok {
			return out, nil
		}
	}
	if err := verifyResponse(buf, limit); err != nil {
		var fe *fbError
		if errors.As(err, &fe) && fe.overLimit {
			return nil, engines.ReplyTooLarge("the worker's response ("+err.Error()+")", int64(len(buf)), limit)
		}
		return nil, &WorkerError{Message: fmt.Sprintf("malformed response (%d bytes): %v", len(buf), err)}
	}
	return decodeVerified(buf, l)
}

// decodeVerified decodes a buffer verifyResponse accepted. The buffer is
// read where it is (native memory for an in-process worker): only what
// the outputs keep is copied out of it (with a loan, l, not their data).
func decodeVerified(buf []byte, l *oneOutput) ([]event.Event, error) {
	r := fbTableAt(buf, int(binary.LittleEndian.Uint32(buf)))
	if msg := r.bytes(slotResponseError); msg != nil {
		// The worker's own error answer (the ABI: a worker.error event,
		// then its error response, or a default one when it gave none).
		m := string(msg)
		if m == "" {
			m = "the worker reported a failure with an empty error_message"
		}
		outs, err := decodeOutputs(buf, r, l)
		if err != nil {
			return nil, err
		}
		return nil, &engines.ErrorAnswer{Message: m, Outputs: outs}
	}
	return decodeOutputs(buf, r, l)
}

// decodeOutputs decodes the result_event and result_events of r, the
// response table (lent from l's buffer when l is not nil).
func decodeOutputs(buf []byte, r fbTable, l *oneOutput) ([]event.Event, error) {
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
	switch {
	case total == 1 && l != nil:
		out, boxes = l.ev[:0], l.box[:]
	case total == 1:
		one := new(oneOutput)
		out, boxes = one.ev[:0], one.box[:]
	default:
		out, boxes = make([]event.Event, 0, total), make([]v1Box, total)
	}
	if first != 0 {
		ev, err := decodeEvent(fbTableAt(buf, first), &boxes[0], l != nil)
		if err != nil {
			return nil, outputError(0, err)
		}
		out = append(out, ev)
	}
	for j := range n {
		ev, err := decodeEvent(r.elem(start, j), &boxes[len(out)], l != nil)
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

// decodeEvent copies one output event (its data only when lend is false:
// then it points into the buffer); a 1.0 event's context is built in box.
// Outputs need a type; id and source may be empty (the dispatcher fills
// them in).
func decodeEvent(ce fbTable, box *v1Box, lend bool) (event.Event, error) {
	typ := ce.bytes(slotEventType)
	if len(typ) == 0 {
		return event.Event{}, fmt.Errorf(`missing required attribute "type"`)
	}
	var c event.EventContext
	var dataCopy []byte
	switch sv := string(ce.bytes(slotEventSpecversion)); sv {
	case "", event.CloudEventsVersionV1:
		// Built directly, with the data (unless lent) and the id and
		// subject copied into one allocation, the type and content type
		// interned: the setters cost an allocation or two each. The data
		// comes first, so that only the strings' part of the slab is
		// zeroed before it is overwritten (make and copy together), and
		// capped, as lent data is: appending to DataEncoded reallocates
		// instead of overwriting the strings or the worker's buffer.
		id, ct, subject, data := ce.bytes(slotEventID), ce.bytes(slotEventDatacontenttype), ce.bytes(slotEventSubject), ce.bytes(slotEventData)
		var slab []byte
		off := 0
		switch {
		case lend:
			if data != nil {
				dataCopy = data[:len(data):len(data)]
			}
			if n := len(id) + len(subject); n > 0 {
				slab = make([]byte, n)
			}
		default:
			slab = make([]byte, len(data)+len(id)+len(subject))
			copy(slab, data)
			if data != nil {
				dataCopy = slab[:len(data):len(data)]
			}
			off = len(data)
		}
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
		c1.ID, c1.Type = str(id), intern(typ)
		if len(ct) > 0 {
			box.ct = intern(ct)
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

// internSlots holds recent short attribute values (output types, content
// types: a worker uses few) as Go strings, so that an output's type costs
// no allocation when an earlier output had the same one. A slot is a
// hash's: a new value replaces the one there. Strings are immutable, so
// sharing one between workers shares nothing but its value.
var internSlots [256]atomic.Pointer[string]

var internSeed = maphash.MakeSeed()

// maxInterned bounds what intern keeps.
const maxInterned = 64

// intern is string(b), taken from internSlots when it is there.
func intern(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if len(b) > maxInterned {
		return string(b)
	}
	slot := &internSlots[maphash.Bytes(internSeed, b)%uint64(len(internSlots))]
	if p := slot.Load(); p != nil && *p == string(b) {
		return *p
	}
	s := string(b)
	slot.Store(&s)
	return s
}
