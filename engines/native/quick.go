package native

import (
	"encoding/binary"
	"math"

	"github.com/cloudevents/sdk-go/v2/event"
)

// decodeQuick is decodeLent's fast path for the usual response: exactly
// one result_event (no result_events, no error_message) with at most an
// id, source, type, specversion 1.0, datacontenttype, subject and data —
// no time, dataschema or extensions. It makes every check verifyResponse
// makes on what it follows (each offset, length and table inside the
// buffer, in 64-bit arithmetic) and charges the same decoding cost
// against limit, in one walk that reads the fields as it checks them
// instead of two. ok false: the buffer is not of that shape or something
// is wrong with it, and the caller decodes it the long way, which says
// what (FuzzDecodeResponse checks that both agree on every input).
func decodeQuick(buf []byte, limit int, l *oneOutput) (out []event.Event, ok bool) {
	if len(buf) > math.MaxInt32 { // verifyResponse refuses it
		return nil, false
	}
	root, ok := qRef(buf, 0)
	if !ok {
		return nil, false
	}
	resp, ok := qTable(buf, root)
	if !ok {
		return nil, false
	}
	if _, present, ok := qField(buf, resp, slotResponseError, 4); !ok || present {
		return nil, false
	}
	if _, present, ok := qField(buf, resp, slotResponseEvents, 4); !ok || present {
		return nil, false
	}
	evPos, present, ok := qField(buf, resp, slotResponseEvent, 4)
	if !ok || !present {
		return nil, false
	}
	if evPos, ok = qRef(buf, evPos); !ok {
		return nil, false
	}
	t, ok := qTable(buf, evPos)
	if !ok {
		return nil, false
	}
	// Every field the event's vtable has, checked; time, extensions and
	// dataschema take the long way.
	var f [slotEventSchema/2 + 1][]byte
	cost := uint64(costEvent)
	for slot := uint64(slotEventID); slot <= slotEventSchema; slot += 2 {
		b, present, ok := qBytes(buf, t, slot)
		if !ok {
			return nil, false
		}
		if !present {
			continue
		}
		switch slot {
		case slotEventTime, slotEventExtensions, slotEventSchema:
			return nil, false
		case slotEventSource:
			cost += costURL + urlFactor*uint64(len(b))
		}
		cost += uint64(len(b))
		f[slot/2] = b
	}
	if limit > 0 && cost > uint64(limit) {
		return nil, false
	}
	typ, sv := f[slotEventType/2], f[slotEventSpecversion/2]
	if len(typ) == 0 || len(sv) > 0 && string(sv) != event.CloudEventsVersionV1 {
		return nil, false
	}
	box := &l.box[0]
	c := &box.ctx
	c.Type = intern(typ)
	if id := f[slotEventID/2]; len(id) > 0 {
		c.ID = string(id)
	}
	if ct := f[slotEventDatacontenttype/2]; len(ct) > 0 {
		box.ct = intern(ct)
		c.DataContentType = &box.ct
	}
	if subject := f[slotEventSubject/2]; len(subject) > 0 {
		box.subject = string(subject)
		c.Subject = &box.subject
	}
	if src := f[slotEventSource/2]; len(src) > 0 {
		if c.SetSource(string(src)) != nil {
			*box = v1Box{}
			return nil, false
		}
	}
	var data []byte
	if d := f[slotEventData/2]; d != nil {
		data = d[:len(d):len(d)]
	}
	l.ev[0] = event.Event{Context: c, DataEncoded: data}
	return l.ev[:1], true
}

// The checks of verifier's table, field, ref and vector (verify.go),
// answering only whether they pass.

func qRef(buf []byte, pos uint64) (uint64, bool) {
	n := uint64(len(buf))
	if pos+4 > n {
		return 0, false
	}
	to := pos + uint64(binary.LittleEndian.Uint32(buf[pos:]))
	return to, to < n
}

func qTable(buf []byte, pos uint64) (tab, bool) {
	n := uint64(len(buf))
	if pos+4 > n {
		return tab{}, false
	}
	vt := int64(pos) - int64(int32(binary.LittleEndian.Uint32(buf[pos:])))
	if vt < 0 || uint64(vt)+4 > n {
		return tab{}, false
	}
	t := tab{pos: pos, vt: uint64(vt)}
	t.vtSize = uint64(binary.LittleEndian.Uint16(buf[t.vt:]))
	t.tSize = uint64(binary.LittleEndian.Uint16(buf[t.vt+2:]))
	if t.vtSize < 4 || t.vtSize%2 != 0 || t.vt+t.vtSize > n || t.tSize < 4 || pos+t.tSize > n {
		return tab{}, false
	}
	return t, true
}

// qField is the position of t's field in slot (present false: absent).
func qField(buf []byte, t tab, slot, size uint64) (pos uint64, present, ok bool) {
	if slot+2 > t.vtSize {
		return 0, false, true
	}
	off := uint64(binary.LittleEndian.Uint16(buf[t.vt+slot:]))
	if off == 0 {
		return 0, false, true
	}
	if off+size > t.tSize {
		return 0, false, false
	}
	return t.pos + off, true, true
}

// qBytes is the string or [ubyte] in t's slot.
func qBytes(buf []byte, t tab, slot uint64) (b []byte, present, ok bool) {
	pos, present, ok := qField(buf, t, slot, 4)
	if !ok || !present {
		return nil, present, ok
	}
	if pos, ok = qRef(buf, pos); !ok {
		return nil, false, false
	}
	n := uint64(len(buf))
	if pos+4 > n {
		return nil, false, false
	}
	cnt, start := uint64(binary.LittleEndian.Uint32(buf[pos:])), pos+4
	if cnt > n-start {
		return nil, false, false
	}
	return buf[start : start+cnt : start+cnt], true, true
}
