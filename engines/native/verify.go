package native

import (
	"encoding/binary"
	"fmt"
	"math"
)

// The worker's response is untrusted bytes: before decodeResponse reads
// anything through the generated accessors (which trust every offset and
// length they find), verifyResponse walks the whole buffer and checks that
// every table, vtable, string and vector lies inside it, with 64-bit
// arithmetic (the accessors compute in uint32 and would wrap). It also adds
// up what decoding would allocate, counting a shared object once per
// reference (decoding copies it each time), so that a small buffer cannot
// make the node allocate more than the reply limit.

// Field slots (vtable byte offsets) of sdk/native/worker_api.fbs.
const (
	slotResponseEvent  = 4 // result_event: CloudEvent
	slotResponseError  = 6 // error_message: string
	slotResponseEvents = 8 // result_events: [CloudEvent]

	slotEventFirstString     = 4  // id .. time: strings in slots 4..16
	slotEventID              = 4  //
	slotEventSource          = 6  //
	slotEventType            = 8  //
	slotEventSpecversion     = 10 //
	slotEventDatacontenttype = 12 //
	slotEventSubject         = 14 //
	slotEventTime            = 16 //
	slotEventLastString      = 16 //
	slotEventData            = 18 // data: [ubyte]
	slotEventExtensions      = 20 // extensions: [Extension]
	slotEventSchema          = 22 // dataschema: string

	slotExtKey   = 4
	slotExtValue = 6
)

// Decoding cost charged per decoded object beyond its bytes (the event's
// context and slab, an extension's map entry, its key and its value), per
// URL attribute (source, dataschema: the parsed URL, and escaping it back
// may take three times its length) and for a time. decodeEvent allocates
// less than this for every output (TestDecodeCostIsCharged), so a reply
// decoded costs the node at most the reply limit.
const (
	costEvent     = 512
	costExtension = 192
	costURL       = 256 // plus urlFactor times its length
	urlFactor     = 4
	costTime      = 64
)

// fbError is what is wrong with a buffer, for the worker's error message.
type fbError struct {
	what string
	pos  uint64
	// overLimit: the buffer is well formed so far but decoding it would
	// allocate more than the reply limit.
	overLimit bool
}

func (e *fbError) Error() string { return fmt.Sprintf("%s at offset %d", e.what, e.pos) }

type verifier struct {
	buf   []byte
	n     uint64 // len(buf)
	cost  int64  // what decoding allocates
	limit int64
}

// verifyResponse checks buf (a WorkerResponse) as described above; limit
// bounds the decoding cost (<= 0: none).
func verifyResponse(buf []byte, limit int) error {
	if uint64(len(buf)) > math.MaxInt32 {
		return fmt.Errorf("response of %d bytes is larger than 2 GiB", len(buf))
	}
	v := &verifier{buf: buf, n: uint64(len(buf)), limit: int64(limit)}
	root, err := v.ref(0)
	if err != nil {
		return fmt.Errorf("root: %w", err)
	}
	t, err := v.table(root)
	if err != nil {
		return fmt.Errorf("response: %w", err)
	}
	if _, _, err := v.bytesField(t, slotResponseError); err != nil {
		return fmt.Errorf("error_message: %w", err)
	}
	if pos, ok, err := v.refField(t, slotResponseEvent); err != nil {
		return fmt.Errorf("result_event: %w", err)
	} else if ok {
		if err := v.event(pos); err != nil {
			return fmt.Errorf("result_event: %w", err)
		}
	}
	if err := v.tableVector(t, slotResponseEvents, v.event); err != nil {
		return fmt.Errorf("result_events: %w", err)
	}
	return nil
}

func (v *verifier) charge(n uint64, pos uint64) error {
	v.cost += int64(n)
	if v.limit > 0 && v.cost > v.limit {
		return &fbError{what: "decoding it would allocate more than the limit", pos: pos, overLimit: true}
	}
	return nil
}

func (v *verifier) u32(pos uint64) (uint32, error) {
	if pos+4 > v.n {
		return 0, &fbError{what: "4-byte field past the end of the buffer", pos: pos}
	}
	return binary.LittleEndian.Uint32(v.buf[pos:]), nil
}

func (v *verifier) u16(pos uint64) (uint16, error) {
	if pos+2 > v.n {
		return 0, &fbError{what: "2-byte field past the end of the buffer", pos: pos}
	}
	return binary.LittleEndian.Uint16(v.buf[pos:]), nil
}

// ref follows the uoffset at pos.
func (v *verifier) ref(pos uint64) (uint64, error) {
	off, err := v.u32(pos)
	if err != nil {
		return 0, err
	}
	to := pos + uint64(off)
	if to >= v.n {
		return 0, &fbError{what: fmt.Sprintf("offset %d points past the end of the buffer", off), pos: pos}
	}
	return to, nil
}

// tab is a verified table: its position, its vtable's and the vtable's
// and the table's sizes.
type tab struct {
	pos, vt       uint64
	vtSize, tSize uint64
}

func (v *verifier) table(pos uint64) (tab, error) {
	s, err := v.u32(pos)
	if err != nil {
		return tab{}, err
	}
	vt := int64(pos) - int64(int32(s))
	if vt < 0 || uint64(vt)+4 > v.n {
		return tab{}, &fbError{what: "vtable outside the buffer", pos: pos}
	}
	t := tab{pos: pos, vt: uint64(vt)}
	vs, _ := v.u16(t.vt)
	ts, _ := v.u16(t.vt + 2)
	t.vtSize, t.tSize = uint64(vs), uint64(ts)
	if t.vtSize < 4 || t.vtSize%2 != 0 || t.vt+t.vtSize > v.n {
		return tab{}, &fbError{what: fmt.Sprintf("vtable of %d bytes does not fit", vs), pos: t.vt}
	}
	if t.tSize < 4 || pos+t.tSize > v.n {
		return tab{}, &fbError{what: fmt.Sprintf("table of %d bytes does not fit", ts), pos: pos}
	}
	return t, nil
}

// field is the position of a table's field (ok false: absent), checked to
// hold size bytes inside the table.
func (v *verifier) field(t tab, slot, size uint64) (uint64, bool, error) {
	if slot+2 > t.vtSize {
		return 0, false, nil
	}
	off, _ := v.u16(t.vt + slot)
	if off == 0 {
		return 0, false, nil
	}
	if uint64(off)+size > t.tSize {
		return 0, false, &fbError{what: fmt.Sprintf("field at %d is outside its %d-byte table", off, t.tSize), pos: t.pos}
	}
	return t.pos + uint64(off), true, nil
}

// refField follows a table's offset field.
func (v *verifier) refField(t tab, slot uint64) (uint64, bool, error) {
	pos, ok, err := v.field(t, slot, 4)
	if !ok || err != nil {
		return 0, false, err
	}
	to, err := v.ref(pos)
	return to, err == nil, err
}

// vector checks the vector at pos of elements of elem bytes and returns its
// length and the position of its first element.
func (v *verifier) vector(pos, elem uint64) (uint64, uint64, error) {
	n, err := v.u32(pos)
	if err != nil {
		return 0, 0, err
	}
	start := pos + 4
	if uint64(n)*elem > v.n-start {
		return 0, 0, &fbError{what: fmt.Sprintf("vector of %d elements does not fit in the buffer's %d bytes", n, v.n), pos: pos}
	}
	return uint64(n), start, nil
}

// bytesField checks a string or [ubyte] field and charges its length.
func (v *verifier) bytesField(t tab, slot uint64) (uint64, bool, error) {
	pos, ok, err := v.refField(t, slot)
	if !ok || err != nil {
		return 0, false, err
	}
	n, _, err := v.vector(pos, 1)
	if err != nil {
		return 0, false, err
	}
	return n, true, v.charge(n, pos)
}

// tableVector checks a vector of tables field and each of its tables.
func (v *verifier) tableVector(t tab, slot uint64, each func(pos uint64) error) error {
	pos, ok, err := v.refField(t, slot)
	if !ok || err != nil {
		return err
	}
	n, start, err := v.vector(pos, 4)
	if err != nil {
		return err
	}
	for i := range n {
		el, err := v.ref(start + 4*i)
		if err != nil {
			return fmt.Errorf("element %d: %w", i, err)
		}
		if err := each(el); err != nil {
			return fmt.Errorf("element %d: %w", i, err)
		}
	}
	return nil
}

func (v *verifier) event(pos uint64) error {
	if err := v.charge(costEvent, pos); err != nil {
		return err
	}
	t, err := v.table(pos)
	if err != nil {
		return err
	}
	for slot := uint64(slotEventFirstString); slot <= slotEventLastString; slot += 2 {
		n, ok, err := v.bytesField(t, slot)
		switch {
		case err != nil:
			return err
		case ok && slot == slotEventSource:
			err = v.charge(costURL+urlFactor*n, pos)
		case ok && slot == slotEventTime:
			err = v.charge(costTime, pos)
		}
		if err != nil {
			return err
		}
	}
	if _, _, err := v.bytesField(t, slotEventData); err != nil {
		return fmt.Errorf("data: %w", err)
	}
	if n, ok, err := v.bytesField(t, slotEventSchema); err != nil {
		return fmt.Errorf("dataschema: %w", err)
	} else if ok {
		if err := v.charge(costURL+urlFactor*n, pos); err != nil {
			return err
		}
	}
	if err := v.tableVector(t, slotEventExtensions, v.extension); err != nil {
		return fmt.Errorf("extensions: %w", err)
	}
	return nil
}

func (v *verifier) extension(pos uint64) error {
	if err := v.charge(costExtension, pos); err != nil {
		return err
	}
	t, err := v.table(pos)
	if err != nil {
		return err
	}
	if _, _, err := v.bytesField(t, slotExtKey); err != nil {
		return fmt.Errorf("key: %w", err)
	}
	if _, _, err := v.bytesField(t, slotExtValue); err != nil {
		return fmt.Errorf("value: %w", err)
	}
	return nil
}
