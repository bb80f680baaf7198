//go:build linux || darwin || freebsd

package native

import (
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/sdk/native/abi"
)

// TestReplyDecodingIsBounded is issue 42's item 4 for native workers, in
// process and from an isolated host (whose reply frame the node reads
// too): replies at the reply limit (one output of nearly the limit's
// bytes, as many tiny outputs as the limit pays for, one output with as
// many extensions as it pays for) are decoded, replies over it (a
// buffer under the limit whose outputs would take many times the limit
// once decoded, a buffer over the limit) are refused before they are
// decoded, and none of them makes the node's heap grow by more than
// engines.ReplyMemoryMultiple times the limit (docs/security.md).
func TestReplyDecodingIsBounded(t *testing.T) {
	limit := engines.ReplyLimit(100, 64<<10) // about 10 MiB
	modes(t, func(t *testing.T, cfg Config) {
		cfg.MaxReplyBytes = limit
		inst := load(t, newTestEngine(t, cfg), testSpec, packageOf(t, flagsEcho, nil))
		mustCall(t, inst, typed("test.stats", nil)) // a host's first-call costs are not the reply's
		cases := []struct {
			name, typ string
			n         int
			accepted  func(out []event.Event) bool // nil: refused as too large
		}{
			{"one output of nearly the limit", "test.bigdata", limit - 4<<10,
				func(out []event.Event) bool { return len(out) == 1 && len(out[0].Data()) == limit-4<<10 }},
			{"tiny outputs up to the limit", "test.manyout", limit / (costEvent + 8),
				func(out []event.Event) bool { return len(out) == limit/(costEvent+8) && out[0].Type() == "a" }},
			{"extensions up to the limit", "test.manyext", limit / (costExtension + 16),
				func(out []event.Event) bool {
					return len(out) == 1 && len(out[0].Extensions()) == limit/(costExtension+16)
				}},
			{"a buffer under the limit of tiny outputs", "test.manyout", limit / 48, nil},
			{"a buffer under the limit of extensions", "test.manyext", limit / 48, nil},
			{"one output over the limit", "test.bigdata", 2 * limit, nil},
		}
		for _, c := range cases {
			var out []event.Event
			var err error
			ev := enginetest.NewEvent("id-"+c.typ, c.typ, nil, "")
			if err := ev.SetData("text/plain", []byte(strconv.Itoa(c.n))); err != nil {
				t.Fatal(err)
			}
			alloc, peak := enginetest.HeapDuring(func() { out, err = call(t, inst, ev) })
			t.Logf("%s (%s %d): allocated %.2fx, peak %.2fx the limit of %d", c.name, c.typ, c.n,
				float64(alloc)/float64(limit), float64(peak)/float64(limit), limit)
			if c.accepted == nil {
				if !errors.Is(err, engines.ErrReplyTooLarge) || !errors.Is(err, engines.ErrWorkerFailed) || len(out) != 0 {
					t.Errorf("%s: %d outputs, err = %v; want ErrReplyTooLarge", c.name, len(out), err)
				} else if c.typ != "test.bigdata" && !strings.Contains(err.Error(), "would allocate more than the limit") {
					t.Errorf("%s: err = %v; want it refused by the verifier", c.name, err)
				}
			} else if err != nil || !c.accepted(out) {
				t.Errorf("%s: %d outputs, err = %v; want them decoded", c.name, len(out), err)
			}
			if alloc > engines.ReplyMemoryMultiple*int64(limit) {
				t.Errorf("%s cost the node %d bytes, %.2fx the limit (more than %dx)", c.name, alloc,
					float64(alloc)/float64(limit), engines.ReplyMemoryMultiple)
			}
			out = nil
		}
		mustCall(t, inst, typed("test.stats", nil))
	})
}

// responseShape builds a WorkerResponse of n events of type "a", each with
// every attribute (full) or none, ext extensions with distinct names, and
// source and dataschema src.
func responseShape(n int, full bool, ext int, specversion, src string) []byte {
	b := flatbuffers.NewBuilder(1 << 16)
	offs := make([]flatbuffers.UOffsetT, n)
	eo := make([]flatbuffers.UOffsetT, ext)
	for i := range n {
		var exts flatbuffers.UOffsetT
		if ext > 0 {
			for j := range ext {
				k, v := b.CreateString(fmt.Sprintf("k%d", j)), b.CreateString("v")
				abi.ExtensionStart(b)
				abi.ExtensionAddKey(b, k)
				abi.ExtensionAddValue(b, v)
				eo[j] = abi.ExtensionEnd(b)
			}
			abi.CloudEventStartExtensionsVector(b, ext)
			for j := ext - 1; j >= 0; j-- {
				b.PrependUOffsetT(eo[j])
			}
			exts = b.EndVector(ext)
		}
		typ := b.CreateString("a")
		var strs [7]flatbuffers.UOffsetT
		if full {
			for j, v := range []string{"i", src, specversion, "a/b", "s", "2024-01-01T00:00:00.5Z", src} {
				strs[j] = b.CreateString(v)
			}
		}
		abi.CloudEventStart(b)
		abi.CloudEventAddType(b, typ)
		if full {
			abi.CloudEventAddId(b, strs[0])
			abi.CloudEventAddSource(b, strs[1])
			abi.CloudEventAddSpecversion(b, strs[2])
			abi.CloudEventAddDatacontenttype(b, strs[3])
			abi.CloudEventAddSubject(b, strs[4])
			abi.CloudEventAddTime(b, strs[5])
			abi.CloudEventAddDataschema(b, strs[6])
		}
		if ext > 0 {
			abi.CloudEventAddExtensions(b, exts)
		}
		offs[i] = abi.CloudEventEnd(b)
	}
	abi.WorkerResponseStartResultEventsVector(b, n)
	for i := n - 1; i >= 0; i-- {
		b.PrependUOffsetT(offs[i])
	}
	vec := b.EndVector(n)
	abi.WorkerResponseStart(b)
	abi.WorkerResponseAddResultEvents(b, vec)
	b.Finish(abi.WorkerResponseEnd(b))
	return append([]byte(nil), b.FinishedBytes()...)
}

// TestDecodeCostIsCharged: for outputs of every shape (bare, every
// attribute in both spec versions, URLs that escape to three times their
// length, few and many extensions), decoding allocates no more than
// verifyResponse charges against the reply limit, so a reply within the
// limit costs the node at most the limit to decode.
func TestDecodeCostIsCharged(t *testing.T) {
	const high = "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"
	for _, s := range []struct {
		n, ext  int
		full    bool
		sv, src string
	}{
		{n: 10000}, {n: 1000, full: true, sv: "1.0", src: "/s"}, {n: 1000, full: true, sv: "0.3", src: "/s"},
		{n: 1000, full: true, sv: "1.0", src: high}, {n: 1000, full: true, sv: "0.3", src: "%41%41%41%41%41%41"},
		{n: 1000, ext: 1}, {n: 1000, ext: 2}, {n: 1000, ext: 9, full: true, sv: "0.3", src: "/s"},
		{n: 10, ext: 5000}, {n: 1, ext: 100000},
	} {
		buf := responseShape(s.n, s.full, s.ext, s.sv, s.src)
		v := &verifier{buf: buf, n: uint64(len(buf))}
		root, _ := v.ref(0)
		tb, _ := v.table(root)
		if err := v.tableVector(tb, slotResponseEvents, v.event); err != nil {
			t.Fatal(err)
		}
		var out []event.Event
		var err error
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		out, err = decodeVerified(buf, nil)
		runtime.ReadMemStats(&after)
		alloc := int64(after.TotalAlloc - before.TotalAlloc)
		if err != nil || len(out) != s.n {
			t.Fatalf("%+v: %d outputs, %v", s, len(out), err)
		}
		t.Logf("%+v: %d bytes, charged %d, allocated %d (%.2f)", s, len(buf), v.cost, alloc, float64(alloc)/float64(v.cost))
		if alloc > v.cost {
			t.Errorf("%+v: decoding allocated %d bytes, more than the %d charged", s, alloc, v.cost)
		}
	}
}
