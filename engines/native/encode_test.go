//go:build linux || darwin || freebsd

package native

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/sdk/native/abi"
)

// encodeShapes are input events of every shape the encoder lays out
// differently: each attribute present or absent, strings of every length
// modulo 4 (padding), data nil, empty and large, extensions none, one,
// many, empty-valued and not strings, both spec versions.
func encodeShapes(t testing.TB) []*event.Event {
	t.Helper()
	var out []*event.Event
	add := func(f func(ev *event.Event)) {
		ev := event.New()
		f(&ev)
		out = append(out, &ev)
	}
	add(func(ev *event.Event) { // the largest first: the encoder's buffer is reused below
		ev.SetID("big")
		ev.SetType("t")
		ev.SetSource("/s")
		_ = ev.SetData("application/octet-stream", bytes.Repeat([]byte{0xAB}, 1<<20+3))
		for i := range 100 {
			ev.SetExtension(fmt.Sprintf("ext%d", i), strings.Repeat("v", i))
		}
	})
	add(func(ev *event.Event) {
		ev.SetID("all")
		ev.SetType("test.all")
		ev.SetSource("https://example.com/a?b=c#d")
		ev.SetSubject("subject-1")
		ev.SetTime(time.Date(2026, 11, 28, 18, 0, 0, 123456789, time.UTC))
		ev.SetDataSchema("https://example.com/schema")
		ev.SetExtension("correlationid", "corr")
		ev.SetExtension("empty", "")
		ev.SetExtension("count", 42)
		ev.SetExtension("flag", true)
		_ = ev.SetData(event.ApplicationJSON, map[string]any{"a": 1})
	})
	for n := range 9 { // every padding
		add(func(ev *event.Event) {
			ev.SetID(strings.Repeat("i", n))
			ev.SetType(strings.Repeat("t", n+1))
			ev.SetSource("/" + strings.Repeat("s", n))
			ev.SetExtension("correlationid", strings.Repeat("c", n))
			_ = ev.SetData("text/plain", []byte(strings.Repeat("d", n)))
		})
	}
	add(func(ev *event.Event) { // empty data: present, empty
		ev.SetID("1")
		ev.SetType("t")
		ev.SetSource("/s")
		ev.DataEncoded = []byte{}
	})
	add(func(ev *event.Event) { // no data, no extension
		ev.SetID("1")
		ev.SetType("t")
		ev.SetSource("/s")
	})
	add(func(ev *event.Event) {
		ev.SetSpecVersion(event.CloudEventsVersionV03)
		ev.SetID("03")
		ev.SetType("t")
		ev.SetSource("/s")
		ev.SetSubject("sub")
		ev.SetExtension("correlationid", "c03")
		_ = ev.SetData(event.ApplicationJSON, []int{1, 2})
	})
	out = append(out, enginetest.BenchEvent1KiB(t))
	return out
}

// encodedFields reads back every field of an encoded CloudEvent through the
// flatc-generated accessors, as a comparable string.
func encodedFields(buf []byte) string {
	ce := abi.GetRootAsCloudEvent(buf, 0)
	var b strings.Builder
	fmt.Fprintf(&b, "id=%q source=%q type=%q spec=%q ct=%q subject=%q time=%q schema=%q data=%v:%q",
		ce.Id(), ce.Source(), ce.Type(), ce.Specversion(), ce.Datacontenttype(), ce.Subject(), ce.Time(),
		ce.Dataschema(), ce.DataBytes() != nil, ce.DataBytes())
	exts := map[string]string{}
	var x abi.Extension
	for i := range ce.ExtensionsLength() {
		ce.Extensions(&x, i)
		exts[string(x.Key())] = string(x.Value())
	}
	fmt.Fprintf(&b, " exts=%v", exts) // printed sorted
	return b.String()
}

// TestEncoderMatchesTheBuilder: the hand-laid-out CloudEvent reads back,
// field by field, as the flatbuffers.Builder encoding from before issue 47
// does, with one reused encoder (large events first, so that stale bytes
// in its buffer would show), and is laid out as FlatBuffers requires:
// 4-byte aligned tables, vectors and strings, NUL-terminated strings,
// offsets pointing forward.
func TestEncoderMatchesTheBuilder(t *testing.T) {
	enc, ref := newEncoder(), newLegacyEncoder()
	for i, ev := range encodeShapes(t) {
		got, err := enc.encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		want, err := ref.encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		if g, w := encodedFields(got), encodedFields(want); g != w {
			t.Fatalf("event %d:\n got %s\nwant %s", i, g, w)
		}
		checkLayout(t, got)
	}
}

// checkLayout checks the alignment, termination and direction rules a
// strict FlatBuffers verifier (the C++ one, flatbuffers::Verifier) applies
// to the encoder's output.
func checkLayout(t *testing.T, buf []byte) {
	t.Helper()
	le := binary.LittleEndian
	u32 := func(p int) int { return int(le.Uint32(buf[p:])) }
	var str func(at int, what string)
	str = func(at int, what string) {
		to := at + u32(at)
		n := u32(to)
		if to <= at || to%4 != 0 || to+4+n >= len(buf) || buf[to+4+n] != 0 {
			t.Fatalf("%s at %d: string at %d of %d bytes is misplaced or not NUL-terminated", what, at, to, n)
		}
	}
	table := func(pos int, slots int, each func(slot, field int)) {
		if pos%4 != 0 {
			t.Fatalf("table at %d is not 4-byte aligned", pos)
		}
		vt := pos - int(int32(le.Uint32(buf[pos:])))
		vtSize, tSize := int(le.Uint16(buf[vt:])), int(le.Uint16(buf[vt+2:]))
		if vt%2 != 0 || vtSize < 4 || vtSize%2 != 0 || vt+vtSize > len(buf) || pos+tSize > len(buf) {
			t.Fatalf("table at %d: vtable at %d of %d bytes, table of %d bytes", pos, vt, vtSize, tSize)
		}
		for s := range slots {
			if 4+2*s+2 > vtSize {
				break
			}
			if off := int(le.Uint16(buf[vt+4+2*s:])); off != 0 {
				if off+4 > tSize || (pos+off)%4 != 0 {
					t.Fatalf("table at %d: field %d at %d", pos, s, off)
				}
				each(s, pos+off)
			}
		}
	}
	root := u32(0)
	table(root, 10, func(slot, field int) {
		switch slot {
		case 8: // extensions
			vec := field + u32(field)
			n := u32(vec)
			if vec <= field || vec%4 != 0 {
				t.Fatalf("extensions vector at %d", vec)
			}
			for i := range n {
				el := vec + 4 + 4*i
				table(el+u32(el), 2, func(_, f int) { str(f, "extension") })
				if el+u32(el) <= el {
					t.Fatalf("extension %d points backwards", i)
				}
			}
		default: // strings, and data (a [ubyte] the encoder also terminates)
			str(field, fmt.Sprintf("field %d", slot))
		}
	})
}

// TestEncodedEventsPassTheFlatBuffersVerifier sends every shape through
// the C++ example worker, which runs flatbuffers::Verifier on its input
// (and answers "malformed input event" when it fails) and echoes the data
// and the correlationid.
func TestEncodedEventsPassTheFlatBuffersVerifier(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the C++ example")
	}
	code := buildExample(t, "../../sdk/native/examples/echo-cpp", "echocpp.zip", "g++", "flatc")
	inst := load(t, newTestEngine(t, Config{}), testSpec, code)
	for i, ev := range encodeShapes(t) {
		out, err := call(t, inst, ev)
		if err != nil {
			t.Fatalf("event %d (%s): %v", i, ev.ID(), err)
		}
		if len(out) != 1 || !bytes.Equal(out[0].Data(), ev.Data()) || out[0].Extensions()["correlationid"] != ev.Extensions()["correlationid"] {
			t.Fatalf("event %d (%s): echoed %d outputs, %d bytes of data, correlationid %v", i, ev.ID(), len(out),
				len(out[0].Data()), out[0].Extensions()["correlationid"])
		}
	}
}
