package wasm

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/sdk/native/abi"
	"github.com/virtufin/workmanager/sdk/wasm/wmwasm"
)

// builderEncoder encodes input events with flatbuffers.Builder and the
// generated package: the reference the engine's encoder is tested against.
type builderEncoder struct {
	b    *flatbuffers.Builder
	exts []flatbuffers.UOffsetT
	tbuf []byte
}

func newBuilderEncoder() *builderEncoder {
	return &builderEncoder{b: flatbuffers.NewBuilder(4096), exts: make([]flatbuffers.UOffsetT, 0, 8), tbuf: make([]byte, 0, 40)}
}

// encode writes ev as a FlatBuffers CloudEvent (root table). Empty
// attributes are left out, as the native engine does.
func (e *builderEncoder) encode(ev *event.Event) ([]byte, error) {
	b := e.b
	b.Reset()
	str := func(s string) flatbuffers.UOffsetT {
		if s == "" {
			return 0
		}
		return b.CreateString(s)
	}
	// Children first (FlatBuffers builds back to front).
	e.exts = e.exts[:0]
	for k, v := range ev.Extensions() {
		s, ok := v.(string)
		if !ok {
			var err error
			if s, err = types.Format(v); err != nil {
				return nil, fmt.Errorf("wasm engine: input extension %q: %w", k, err)
			}
		}
		ko, vo := b.CreateString(k), b.CreateString(s)
		abi.ExtensionStart(b)
		abi.ExtensionAddKey(b, ko)
		abi.ExtensionAddValue(b, vo)
		e.exts = append(e.exts, abi.ExtensionEnd(b))
	}
	var extVec flatbuffers.UOffsetT
	if len(e.exts) > 0 {
		abi.CloudEventStartExtensionsVector(b, len(e.exts))
		for i := len(e.exts) - 1; i >= 0; i-- {
			b.PrependUOffsetT(e.exts[i])
		}
		extVec = b.EndVector(len(e.exts))
	}
	var data flatbuffers.UOffsetT
	if d := ev.Data(); d != nil {
		data = b.CreateByteVector(d)
	}
	e.tbuf = e.tbuf[:0]
	if t := ev.Time(); !t.IsZero() {
		e.tbuf = t.AppendFormat(e.tbuf, time.RFC3339Nano)
	}
	var tm flatbuffers.UOffsetT
	if len(e.tbuf) > 0 {
		tm = b.CreateByteString(e.tbuf)
	}
	id, source, typ, spec := str(ev.ID()), str(ev.Source()), str(ev.Type()), str(ev.SpecVersion())
	ct, subject, schema := str(ev.DataContentType()), str(ev.Subject()), str(ev.DataSchema())
	abi.CloudEventStart(b)
	for _, f := range []struct {
		off flatbuffers.UOffsetT
		add func(*flatbuffers.Builder, flatbuffers.UOffsetT)
	}{
		{id, abi.CloudEventAddId}, {source, abi.CloudEventAddSource}, {typ, abi.CloudEventAddType},
		{spec, abi.CloudEventAddSpecversion}, {ct, abi.CloudEventAddDatacontenttype}, {subject, abi.CloudEventAddSubject},
		{tm, abi.CloudEventAddTime}, {data, abi.CloudEventAddData}, {extVec, abi.CloudEventAddExtensions},
		{schema, abi.CloudEventAddDataschema},
	} {
		if f.off != 0 {
			f.add(b, f.off)
		}
	}
	b.Finish(abi.CloudEventEnd(b))
	return b.FinishedBytes(), nil
}

// encodedFields reads an encoded CloudEvent back through the generated
// package, extensions sorted.
func encodedFields(buf []byte) string {
	ce := abi.GetRootAsCloudEvent(buf, 0)
	var exts []string
	var x abi.Extension
	for j := range ce.ExtensionsLength() {
		ce.Extensions(&x, j)
		exts = append(exts, string(x.Key())+"="+string(x.Value()))
	}
	sort.Strings(exts)
	return fmt.Sprintf("id=%q source=%q type=%q spec=%q ct=%q subject=%q time=%q data=%q(nil=%v) schema=%q exts=%q",
		ce.Id(), ce.Source(), ce.Type(), ce.Specversion(), ce.Datacontenttype(), ce.Subject(), ce.Time(), ce.DataBytes(),
		ce.DataBytes() == nil, ce.Dataschema(), exts)
}

func TestEncoderMatchesTheBuilder(t *testing.T) {
	full := event.New()
	full.SetID("id-1")
	full.SetSource("https://example.com/a b?q=1")
	full.SetType("t.full")
	full.SetSubject("subj")
	full.SetTime(time.Date(2026, 11, 28, 12, 0, 0, 123456789, time.UTC))
	full.SetDataSchema("https://example.com/schema")
	full.SetExtension("correlationid", "c-1")
	full.SetExtension("count", 3)
	full.SetExtension("flag", true)
	if err := full.SetData("text/plain", []byte("héllo")); err != nil {
		t.Fatal(err)
	}
	empty := event.New()
	empty.SetID("e")
	empty.SetType("t")
	v03 := event.New(event.CloudEventsVersionV03)
	v03.SetID("v03")
	v03.SetSource("/s")
	v03.SetType("t.v03")
	zeroData := enginetest.NewEvent("z", "t", nil, "")
	zeroData.DataEncoded = []byte{}
	enc, ref := newEncoder(), newBuilderEncoder()
	for i, ev := range []*event.Event{&full, &empty, &v03, zeroData, enginetest.BenchEvent1KiB(t),
		enginetest.NewEvent("n", "t", map[string]any{"a": strings.Repeat("x", 100000)}, "c")} {
		got, err := enc.encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		gotFields := encodedFields(got)
		want, err := ref.encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		if wantFields := encodedFields(want); gotFields != wantFields {
			t.Errorf("event %d:\n got %s\nwant %s", i, gotFields, wantFields)
		}
		// The SDK reads it too.
		if p, err := wmwasm.ParseEvent(got); err != nil || p.ID != ev.ID() || p.Type != ev.Type() || string(p.Data) != string(ev.Data()) {
			t.Errorf("event %d: the Go SDK reads %+v, %v", i, p, err)
		}
	}
}

// responseOf builds a WorkerResponse whose result_events are n references
// to one event of type typ with data.
func responseOf(typ string, data []byte, n int) []byte {
	b := flatbuffers.NewBuilder(256)
	d := b.CreateByteVector(data)
	to := b.CreateString(typ)
	abi.CloudEventStart(b)
	abi.CloudEventAddType(b, to)
	abi.CloudEventAddData(b, d)
	ev := b.EndObject()
	abi.WorkerResponseStartResultEventsVector(b, n)
	for range n {
		b.PrependUOffsetT(ev)
	}
	vec := b.EndVector(n)
	abi.WorkerResponseStart(b)
	abi.WorkerResponseAddResultEvents(b, vec)
	b.Finish(abi.WorkerResponseEnd(b))
	return b.FinishedBytes()
}

func TestDecodeResponses(t *testing.T) {
	// A full output, read back.
	resp := wmwasm.BuildResponse([]wmwasm.Output{{ID: "o", Source: "/src", Type: "t.out", Subject: "s", DataContentType: "application/json",
		Data: []byte(`{"a":1}`), Extensions: map[string]string{"correlationid": "c-9"}}, {Type: "t.second"}}, "")
	out, err := decodeResponse(resp, 0)
	if err != nil || len(out) != 2 {
		t.Fatalf("decode = %v, %v", out, err)
	}
	o := out[0]
	if o.ID() != "o" || o.Source() != "/src" || o.Type() != "t.out" || o.Subject() != "s" || o.DataContentType() != "application/json" ||
		string(o.Data()) != `{"a":1}` || o.Extensions()["correlationid"] != "c-9" || out[1].Type() != "t.second" {
		t.Fatalf("decoded %v", out)
	}
	// error_message is the worker's error answer (with return code 0;
	// withCode makes a non-zero code a failure), its outputs its error
	// response.
	var answer *engines.ErrorAnswer
	if _, err := decodeResponse(wmwasm.BuildResponse(nil, "boom"), 0); !errors.As(err, &answer) || answer.Message != "boom" || len(answer.Outputs) != 0 {
		t.Fatalf("error response = %v", err)
	}
	if _, err := decodeResponse(wmwasm.BuildResponse([]wmwasm.Output{{Type: "t.refused"}}, "boom"), 0); !errors.As(err, &answer) || len(answer.Outputs) != 1 || answer.Outputs[0].Type() != "t.refused" {
		t.Fatalf("error response with its own output = %v", err)
	}
	if _, err := withCode(3, nil, answer); errors.As(err, &answer) || !errors.Is(err, engines.ErrWorkerFailed) || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("error response with code 3 = %v, want a failure", err)
	}
	// An output without a type is invalid output.
	if _, err := decodeResponse(wmwasm.BuildResponse([]wmwasm.Output{{ID: "x"}}, ""), 0); !errors.Is(err, engines.ErrInvalidOutput) {
		t.Fatalf("typeless output = %v", err)
	}
}

func TestDecodeForgedResponsesFailCleanly(t *testing.T) {
	valid := responseOf("a", []byte("data"), 2)
	forged := [][]byte{
		nil, {1, 2, 3},
		{0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0},
		// Issue 34's 48 bytes: result_events claims ~4 billion elements.
		{0x10, 0, 0, 0, 0, 0, 0x0a, 0, 0x08, 0, 0, 0, 0, 0, 0x04, 0, 0x0a, 0, 0, 0, 0x04, 0, 0, 0, 0xf0, 0xff, 0xff, 0xff,
			0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
	}
	for i := range len(valid) {
		f := append([]byte{}, valid...)
		f[i] ^= 0xff
		forged = append(forged, f, valid[:i])
	}
	for i, buf := range forged {
		out, err := decodeResponse(buf, 1<<20)
		if err == nil {
			continue // a flipped byte may still be a valid response
		}
		if !errors.Is(err, engines.ErrWorkerFailed) {
			t.Fatalf("forged %d: %v, want a worker failure (outputs %v)", i, err, out)
		}
	}
}

func TestDecodeSharedEventsIsBoundedByTheLimit(t *testing.T) {
	// 1,000 references to one event of 64 KiB of data: 64 MB decoded from
	// a buffer of 68 KB.
	resp := responseOf("a", make([]byte, 64<<10), 1000)
	_, err := decodeResponse(resp, 1<<20)
	if !errors.Is(err, engines.ErrReplyTooLarge) {
		t.Fatalf("decode = %v, want ErrReplyTooLarge", err)
	}
	if _, err := decodeResponse(resp, len(resp)-1); !errors.Is(err, engines.ErrReplyTooLarge) {
		t.Fatalf("a response over the limit = %v", err)
	}
}

// FuzzDecodeResponse: any bytes decode to outputs or an error, never a
// panic, and within the limit.
func FuzzDecodeResponse(f *testing.F) {
	f.Add(responseOf("a", []byte("data"), 2))
	f.Add(wmwasm.BuildResponse([]wmwasm.Output{{ID: "o", Source: "/s", Type: "t", Subject: "s", DataContentType: "application/json",
		Data: []byte(`{}`), Extensions: map[string]string{"correlationid": "c"}}}, ""))
	f.Add(wmwasm.BuildResponse(nil, "boom"))
	f.Fuzz(func(t *testing.T, buf []byte) {
		out, err := decodeResponse(buf, 1<<16)
		if err != nil && !errors.Is(err, engines.ErrWorkerFailed) {
			t.Fatalf("decode = %v, want a worker failure", err)
		}
		total := 0
		for _, ev := range out {
			total += len(ev.Data())
		}
		if total > 1<<16 {
			t.Fatalf("decoded %d bytes of data with a limit of 64 KiB", total)
		}
	})
}
