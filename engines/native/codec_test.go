package native

import (
	"encoding/binary"
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/sdk/native/abi"
)

// responseOf builds a WorkerResponse whose result_events are n references
// to one event of type typ with data (n = 0: an empty vector).
func responseOf(typ string, data []byte, n int) []byte {
	b := flatbuffers.NewBuilder(256)
	var evOff flatbuffers.UOffsetT
	if n > 0 {
		d := b.CreateByteVector(data)
		t := b.CreateString(typ)
		abi.CloudEventStart(b)
		abi.CloudEventAddType(b, t)
		abi.CloudEventAddData(b, d)
		evOff = abi.CloudEventEnd(b)
	}
	abi.WorkerResponseStartResultEventsVector(b, n)
	for range n {
		b.PrependUOffsetT(evOff)
	}
	vec := b.EndVector(n)
	abi.WorkerResponseStart(b)
	abi.WorkerResponseAddResultEvents(b, vec)
	b.Finish(abi.WorkerResponseEnd(b))
	return append([]byte(nil), b.FinishedBytes()...)
}

// resultEventsLengthAt is the position of the result_events vector's
// length in a response built by responseOf.
func resultEventsLengthAt(t testing.TB, buf []byte) int {
	t.Helper()
	root := int(binary.LittleEndian.Uint32(buf))
	vt := root - int(int32(binary.LittleEndian.Uint32(buf[root:])))
	off := int(binary.LittleEndian.Uint16(buf[vt+slotResponseEvents:]))
	field := root + off
	return field + int(binary.LittleEndian.Uint32(buf[field:]))
}

// forgedReply is the reply of issue 34: 48 bytes whose result_events
// vector says it has about 4 billion elements (make() of that many
// events was a fatal out-of-memory error that recover cannot catch).
func forgedReply(t testing.TB) []byte {
	buf := responseOf("", nil, 0)
	if len(buf) > 48 {
		t.Fatalf("base response is %d bytes", len(buf))
	}
	buf = append(buf, make([]byte, 48-len(buf))...)
	binary.LittleEndian.PutUint32(buf[resultEventsLengthAt(t, buf):], 0xFFFFFFF0)
	return buf
}

func TestDecodeForgedVectorLengthFailsCleanly(t *testing.T) {
	buf := forgedReply(t)
	if len(buf) != 48 {
		t.Fatalf("forged reply is %d bytes", len(buf))
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	out, err := decodeResponse(buf, engines.DefaultMaxReplyBytes)
	runtime.ReadMemStats(&after)
	var werr *WorkerError
	if !errors.As(err, &werr) || !errors.Is(err, engines.ErrWorkerFailed) || len(out) != 0 {
		t.Fatalf("decodeResponse = %d events, %v; want a *WorkerError", len(out), err)
	}
	if !strings.Contains(err.Error(), "result_events") || !strings.Contains(err.Error(), "does not fit") {
		t.Fatalf("error %q does not say what is wrong", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Fatalf("decoding 48 bytes allocated %d bytes", grew)
	}
	// Smaller lies too: 10^8 events were a multi-GB spike.
	binary.LittleEndian.PutUint32(buf[resultEventsLengthAt(t, buf):], 100_000_000)
	if _, err := decodeResponse(buf, 0); !errors.As(err, &werr) {
		t.Fatalf("10^8 elements: %v", err)
	}
}

func TestDecodeForgedLengths(t *testing.T) {
	good := responseOf("t", []byte("hello"), 1)
	if out, err := decodeResponse(good, 0); err != nil || len(out) != 1 || string(out[0].Data()) != "hello" {
		t.Fatalf("good response: %v, %v", out, err)
	}
	// Every 4-byte word of the buffer set to huge and wrapping values:
	// never a panic that is not an error, never a big allocation.
	for i := 0; i+4 <= len(good); i++ {
		for _, v := range []uint32{0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, uint32(len(good)), 1 << 20} {
			buf := append([]byte(nil), good...)
			binary.LittleEndian.PutUint32(buf[i:], v)
			if err := verifyResponse(buf, 1<<20); err == nil {
				if _, derr := decodeVerified(buf, nil); derr != nil {
					var werr *WorkerError
					if !errors.As(derr, &werr) && !errors.Is(derr, engines.ErrWorkerFailed) {
						t.Fatalf("word %d = %#x: %v", i, v, derr)
					}
				}
			}
		}
	}
}

func TestDecodeSharedEventsBoundedByLimit(t *testing.T) {
	// 4 bytes per reference to one event with 64 KiB of data: 1,000
	// references decode to 64 MB from a buffer of 70 KB.
	buf := responseOf("t", make([]byte, 64<<10), 1000)
	_, err := decodeResponse(buf, 8<<20)
	if !errors.Is(err, engines.ErrReplyTooLarge) || !errors.Is(err, engines.ErrWorkerFailed) {
		t.Fatalf("err = %v, want ErrReplyTooLarge", err)
	}
	if out, err := decodeResponse(buf, 128<<20); err != nil || len(out) != 1000 {
		t.Fatalf("under a big enough limit: %d events, %v", len(out), err)
	}
}

func TestDecodeResponseOverLimit(t *testing.T) {
	buf := responseOf("t", make([]byte, 2<<20), 1)
	_, err := decodeResponse(buf, 1<<20)
	if !errors.Is(err, engines.ErrReplyTooLarge) || !strings.Contains(err.Error(), "exceeds the limit of 1048576 bytes") {
		t.Fatalf("err = %v", err)
	}
}

// FuzzDecodeResponse: whatever bytes a worker returns, decoding never
// panics (the recover in decodeResponse is not relied on: a buffer
// verifyResponse accepts is decoded without it) and never allocates more
// than the limit allows.
func FuzzDecodeResponse(f *testing.F) {
	f.Add(responseOf("t", []byte("data"), 1))
	f.Add(responseOf("t", []byte("data"), 3))
	f.Add(responseOf("", nil, 0))
	f.Add(forgedReply(f))
	f.Add(singleResponse(single{typ: "t", ct: "application/json", data: []byte(`"x"`)}))
	f.Add(singleResponse(single{id: "o-1", source: "/orders", typ: "orders.done", spec: "1.0", ct: "application/json", subject: "A-7", data: []byte(`{}`)}))
	f.Add(singleResponse(single{typ: "t", ext: true, time: "2026-11-29T05:00:00Z"}))
	enc := newEncoder()
	ev := event.New()
	ev.SetID("1")
	ev.SetType("t")
	ev.SetSource("/s")
	ev.SetExtension("correlationid", "c")
	_ = ev.SetData("application/json", map[string]any{"a": 1})
	in, err := enc.encode(&ev)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(append([]byte(nil), in...)) // a CloudEvent root, not a response
	f.Fuzz(func(t *testing.T, buf []byte) {
		const limit = 1 << 20
		// decodeQuick, the lent fast path, takes only what the long way
		// takes, and decodes it the same, whatever the limit.
		for _, lim := range []int{limit, 600, 1200} {
			var quick, long oneOutput
			qout, ok := decodeQuick(buf, lim, &quick)
			if !ok {
				continue
			}
			if err := verifyResponse(buf, lim); err != nil {
				t.Fatalf("limit %d: decodeQuick took a buffer verifyResponse refuses (%v)", lim, err)
			}
			lout, err := decodeVerified(buf, &long)
			if err != nil || len(qout) != 1 || len(lout) != 1 || !sameOutput(&qout[0], &lout[0]) {
				t.Fatalf("limit %d: decodeQuick %v, the long way %v (%v)", lim, qout, lout, err)
			}
		}
		if err := verifyResponse(buf, limit); err != nil {
			if _, derr := decodeResponse(buf, limit); derr == nil && len(buf) >= 8 {
				t.Fatalf("verify failed (%v) but decodeResponse accepted", err)
			}
			return
		}
		out, _ := decodeVerified(buf, nil)
		if len(out) > len(buf)/4+1 {
			t.Fatalf("%d events from %d bytes", len(out), len(buf))
		}
	})
}

// sameOutput compares what a decoded output carries.
func sameOutput(a, b *event.Event) bool {
	return a.ID() == b.ID() && a.Type() == b.Type() && a.Source() == b.Source() && a.Subject() == b.Subject() &&
		a.DataContentType() == b.DataContentType() && a.SpecVersion() == b.SpecVersion() && a.DataSchema() == b.DataSchema() &&
		a.Time().Equal(b.Time()) && len(a.Extensions()) == len(b.Extensions()) && string(a.DataEncoded) == string(b.DataEncoded) &&
		(a.DataEncoded == nil) == (b.DataEncoded == nil)
}
