package native

import (
	"strings"
	"testing"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/virtufin/workmanager/sdk/native/abi"
)

// single is one output's attributes for singleResponse ("" and nil:
// absent).
type single struct {
	id, source, typ, spec, ct, subject, time, schema string
	data                                             []byte
	ext                                              bool
}

// singleResponse builds a WorkerResponse with s as its result_event.
func singleResponse(s single) []byte {
	b := flatbuffers.NewBuilder(256)
	str := func(v string) flatbuffers.UOffsetT {
		if v == "" {
			return 0
		}
		return b.CreateString(v)
	}
	id, src, typ, spec, ct, subj, tm, schema := str(s.id), str(s.source), str(s.typ), str(s.spec), str(s.ct), str(s.subject), str(s.time), str(s.schema)
	var data, exts flatbuffers.UOffsetT
	if s.data != nil {
		data = b.CreateByteVector(s.data)
	}
	if s.ext {
		k, v := b.CreateString("k"), b.CreateString("v")
		abi.ExtensionStart(b)
		abi.ExtensionAddKey(b, k)
		abi.ExtensionAddValue(b, v)
		x := abi.ExtensionEnd(b)
		abi.CloudEventStartExtensionsVector(b, 1)
		b.PrependUOffsetT(x)
		exts = b.EndVector(1)
	}
	abi.CloudEventStart(b)
	for _, f := range []struct {
		off flatbuffers.UOffsetT
		add func(*flatbuffers.Builder, flatbuffers.UOffsetT)
	}{{id, abi.CloudEventAddId}, {src, abi.CloudEventAddSource}, {typ, abi.CloudEventAddType}, {spec, abi.CloudEventAddSpecversion},
		{ct, abi.CloudEventAddDatacontenttype}, {subj, abi.CloudEventAddSubject}, {tm, abi.CloudEventAddTime}, {data, abi.CloudEventAddData},
		{exts, abi.CloudEventAddExtensions}, {schema, abi.CloudEventAddDataschema}} {
		if f.off != 0 {
			f.add(b, f.off)
		}
	}
	ev := abi.CloudEventEnd(b)
	abi.WorkerResponseStart(b)
	abi.WorkerResponseAddResultEvent(b, ev)
	b.Finish(abi.WorkerResponseEnd(b))
	return append([]byte(nil), b.FinishedBytes()...)
}

// decodeQuick, the lent fast path, decodes the usual single output as the
// long way (verify, then read) does, leaves every other shape and every
// error to it, and holds to the same reply limit.
func TestDecodeQuickAgreesWithTheLongWay(t *testing.T) {
	full := single{id: "o-1", source: "/orders", typ: "orders.done", spec: "1.0", ct: "application/json", subject: "A-7", data: []byte(`{"ok":true}`)}
	for name, c := range map[string]struct {
		s     single
		limit int
		quick bool // taken by the fast path
	}{
		"type and data":         {single{typ: "t", ct: "application/json", data: []byte(`"x"`)}, 1 << 20, true},
		"every attribute taken": {full, 1 << 20, true},
		"empty data":            {single{typ: "t", data: []byte{}}, 1 << 20, true},
		"no data":               {single{typ: "t"}, 1 << 20, true},
		"with a time":           {single{typ: "t", time: "2026-11-29T05:00:00Z"}, 1 << 20, false},
		"with a schema":         {single{typ: "t", schema: "/s"}, 1 << 20, false},
		"with an extension":     {single{typ: "t", ext: true}, 1 << 20, false},
		"specversion 0.3":       {single{typ: "t", spec: "0.3"}, 1 << 20, false},
		"no type":               {single{id: "x"}, 1 << 20, false},
		"bad source":            {single{typ: "t", source: "%zz"}, 1 << 20, false},
		"over the limit":        {single{typ: "t", data: []byte(strings.Repeat("x", 600))}, 1000, false},
		"source over the limit": {single{typ: "t", source: strings.Repeat("s", 60)}, 1000, false},
	} {
		t.Run(name, func(t *testing.T) {
			buf := singleResponse(c.s)
			var quick, long oneOutput
			qout, ok := decodeQuick(buf, c.limit, &quick)
			if ok != c.quick {
				t.Fatalf("decodeQuick took it: %v, want %v", ok, c.quick)
			}
			lout, lerr := decodeInto(buf, c.limit, &long)
			if !ok {
				var copied oneOutput
				if cout, cerr := decodeInto(buf, c.limit, &copied); (cerr == nil) != (lerr == nil) || len(cout) != len(lout) {
					t.Fatalf("the long way answered twice differently: %v / %v", cerr, lerr)
				}
				return
			}
			if lerr != nil || len(lout) != 1 || len(qout) != 1 || !sameOutput(&qout[0], &lout[0]) {
				t.Fatalf("decodeQuick %v, the long way %v (%v)", qout, lout, lerr)
			}
			if err := verifyResponse(buf, c.limit); err != nil {
				t.Fatalf("decodeQuick took a buffer verifyResponse refuses: %v", err)
			}
		})
	}
}
