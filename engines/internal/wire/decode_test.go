package wire

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
)

// testLimit is the reply limit of the decoding tests: every payload below
// is at most this long, so the frame reader lets it through.
const testLimit = 4 << 20

// fill repeats elem, separated by commas, between open and close, up to
// testLimit bytes.
func fill(open, elem, close string) []byte {
	var b bytes.Buffer
	b.WriteString(open)
	for n := 0; b.Len()+len(elem)+1+len(close) <= testLimit; n++ {
		if n > 0 {
			b.WriteByte(',')
		}
		b.WriteString(elem)
	}
	b.WriteString(close)
	return b.Bytes()
}

// extensions is one output with n extensions e0..e(n-1) of value v.
func extensions(n int, v string) string {
	var b strings.Builder
	b.WriteString(`{"specversion":"1.0","type":"a"`)
	for i := range n {
		fmt.Fprintf(&b, `,"e%d":%s`, i, v)
	}
	b.WriteString("}")
	return b.String()
}

// allocated runs f and returns the bytes the heap allocated meanwhile (an
// upper bound of how far the heap's peak rose above where it was) and the
// bytes still live afterwards.
func allocated(f func()) (alloc, live int64) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	alloc = int64(after.TotalAlloc - before.TotalAlloc)
	runtime.GC()
	runtime.ReadMemStats(&after)
	return alloc, int64(after.HeapAlloc) - int64(before.HeapAlloc)
}

// TestDecodeOutputsRefusesBeforeAllocating is issue 42's item 4: replies
// within the frame limit whose decoding would take many times the limit
// (two million tiny outputs, a list of numbers written to the pipe by the
// worker itself, an output with hundreds of thousands of extensions, a
// nested extension value) are refused while they are counted, before the
// node allocates for them.
func TestDecodeOutputsRefusesBeforeAllocating(t *testing.T) {
	oneMany := extensions(testLimit/14, `""`)
	for name, payload := range map[string][]byte{
		"tiny outputs":            fill("[", `{"specversion":"1.0","type":"a"}`, "]"),
		"raw list of numbers":     fill("[", "1", "]"),
		"raw list of lists":       fill("[", "[]", "]"),
		"one output, extensions":  []byte(oneMany),
		"outputs with extensions": fill("[", extensions(100, "1"), "]"),
		"nested extension value":  fill(`{"specversion":"1.0","type":"a","x":[`, "[]", "]}"),
		"nested extension object": fill(`{"specversion":"1.0","type":"a","x":{"a":[`, "{}", "]}}"),
	} {
		t.Run(name, func(t *testing.T) {
			if len(payload) > testLimit {
				t.Fatalf("payload of %d bytes", len(payload))
			}
			var err error
			alloc, _ := allocated(func() { _, err = DecodeOutputs(payload, testLimit) })
			var werr *Error
			if !errors.As(err, &werr) || !errors.Is(err, engines.ErrWorkerFailed) {
				t.Fatalf("err = %v, want a worker failure", err)
			}
			if alloc > 64<<10 {
				t.Errorf("refusing a %d-byte reply allocated %d bytes (%.1fx the limit); err %v", len(payload), alloc, float64(alloc)/testLimit, err)
			}
		})
	}
	// Those over the limit say so (reason output_limit in dispatch).
	_, err := DecodeOutputs(fill("[", `{"specversion":"1.0","type":"a"}`, "]"), testLimit)
	if !errors.Is(err, engines.ErrReplyTooLarge) || !strings.Contains(err.Error(), fmt.Sprint(testLimit)) {
		t.Errorf("err = %v, want ErrReplyTooLarge naming the limit", err)
	}
}

// TestDecodeOutputsMemoryIsAMultipleOfTheLimit: replies that the limit
// lets through, each filled to the limit with what costs the node most
// (tiny outputs, extensions, data in each encoding) allocate at most the
// limit while they are decoded (docs/security.md states the node's
// multiple: this plus the frame, itself at most the limit).
func TestDecodeOutputsMemoryIsAMultipleOfTheLimit(t *testing.T) {
	b64 := strings.Repeat("QUJD", testLimit/16)
	text := strings.Repeat(`a\n\"é`, testLimit/64)
	for name, elem := range map[string]string{
		"tiny outputs":          `{"specversion":"1.0","type":"a"}`,
		"extensions":            extensions(500, `"v"`),
		"number extensions":     extensions(500, `1`),
		"base64 data":           `{"specversion":"1.0","type":"a","data_base64":"` + b64 + `"}`,
		"base64 data, typed":    `{"specversion":"1.0","type":"a","datacontenttype":"application/octet-stream","data_base64":"` + b64 + `"}`,
		"escaped text data":     `{"specversion":"1.0","type":"a","datacontenttype":"text/plain","data":"` + text + `"}`,
		"JSON data":             `{"specversion":"1.0","type":"a","datacontenttype":"application/json","data":["` + b64 + `"]}`,
		"specversion 0.3, data": `{"specversion":"0.3","type":"a","datacontentencoding":"base64","data":"` + b64[:len(b64)/4] + `"}`,
		"tiny outputs, no data": `{"specversion":"1.0","type":"a","id":"x","source":"s","subject":"x","time":"2020-01-01T00:00:00Z","dataschema":"http://x/y","datacontenttype":"text/plain"}`,
	} {
		t.Run(name, func(t *testing.T) {
			cost, err := outputCost([]byte(elem))
			if err != nil {
				t.Fatal(err)
			}
			n := max(1, testLimit*95/100/int(cost+1))
			payload := []byte("[" + strings.Repeat(elem+",", n-1) + elem + "]")
			if len(payload) > testLimit {
				t.Fatalf("payload of %d bytes", len(payload))
			}
			var got int
			alloc, _ := allocated(func() {
				out, derr := DecodeOutputs(payload, testLimit)
				got, err = len(out), derr
			})
			if err != nil || got != n {
				t.Fatalf("%d outputs, %v; want %d", got, err, n)
			}
			t.Logf("%d outputs from %d bytes: allocated %.2fx the limit", n, len(payload), float64(alloc)/testLimit)
			if alloc > testLimit {
				t.Errorf("decoding allocated %d bytes, %.2fx the limit of %d", alloc, float64(alloc)/testLimit, testLimit)
			}
		})
	}
}

// TestDecodeErrorBoundsTheText is issue 42's item 5: a worker's error
// report is cut where it is decoded, before anything matches a regexp
// over it or carries it on.
func TestDecodeErrorBoundsTheText(t *testing.T) {
	big := strings.Repeat("é", 4<<20) // 8 MiB, two bytes a rune
	payload := fmt.Sprintf(`{"type":%q,"message":%q,"traceback":%q}`, big, big, big+"last line")
	err := DecodeError(engines.ErrInvalidCode, []byte(payload))
	var werr *Error
	if !errors.As(err, &werr) || !errors.Is(err, engines.ErrInvalidCode) {
		t.Fatalf("err = %T %v", err, err)
	}
	if len(werr.Type) > MaxErrorType || len(werr.Message) > MaxErrorMessage || len(werr.Traceback) > MaxErrorTraceback {
		t.Fatalf("type %d, message %d, traceback %d bytes", len(werr.Type), len(werr.Message), len(werr.Traceback))
	}
	if len(err.Error()) > MaxErrorType+MaxErrorMessage+64 {
		t.Fatalf("error text of %d bytes", len(err.Error()))
	}
	for _, s := range []string{werr.Type, werr.Message, werr.Traceback} {
		if !utf8.ValidString(s) {
			t.Fatal("cut inside a character")
		}
	}
	if !strings.HasSuffix(werr.Traceback, "last line") {
		t.Error("the traceback's end (the innermost frames) was not kept")
	}
	// What is kept must not pin the 40 MiB strings it was cut from.
	_, live := allocated(func() { err = DecodeError(engines.ErrInvalidCode, []byte(payload)) })
	runtime.KeepAlive(err)
	if live > 1<<20 {
		t.Errorf("the decoded error keeps %d bytes alive", live)
	}
}

func TestTruncate(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"abc", 3, "abc"},
		{"abcdef", 5, "ab..."},
		{"ééé", 5, "é..."},
		{"ééé", 4, "..."}, // no room for a whole é before the marker
		{"aééé", 5, "a..."},
		{"abcdef", 2, "ab"},
	} {
		if got := Truncate(c.in, c.n); got != c.want {
			t.Errorf("Truncate(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}

// FuzzDecodeOutputsMatchesTheSDK: an output DecodeOutputs accepts (its
// data decoded here, its attributes by the CloudEvents decoder) is the
// event the CloudEvents decoder makes of it whole.
func FuzzDecodeOutputsMatchesTheSDK(f *testing.F) {
	f.Add([]byte(`{"specversion":"1.0","type":"t","data":{"a":1}}`))
	f.Add([]byte(`[{"specversion":"1.0","type":"a","datacontenttype":"text/plain","data":"a\nb\u00e9\ud83d\ude00\/"},{"specversion":"1.0","type":"b","data_base64":"aGk="}]`))
	f.Add([]byte(`{"specversion":"1.0","type":"t","datacontenttype":"application/octet-stream","data_base64":"aGk=","x":1,"y":"z","b":true}`))
	f.Add([]byte(`{"type":"t","data":[1,2],"specversion":"1.0","datacontenttype":"application/json;charset=utf-8"}`))
	f.Add([]byte(`{"specversion":"1.0","type":"t","datacontenttype":"text/plain","data":null}`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		out, err := DecodeOutputs(payload, 1<<20)
		if err != nil || len(out) == 0 {
			return
		}
		var elems [][]byte
		if i := skipSpace(payload, 0); payload[i] == '{' {
			elems = [][]byte{payload}
		} else {
			_ = eachElement(payload, i, func(_ int, e []byte) error { elems = append(elems, e); return nil })
		}
		for i, elem := range elems {
			var ev event.Event
			if err := ev.UnmarshalJSON(elem); err != nil {
				t.Fatalf("accepted %q, which the CloudEvents decoder refuses: %v", elem, err)
			}
			want, _ := ev.MarshalJSON()
			got, _ := out[i].MarshalJSON()
			if !bytes.Equal(want, got) {
				t.Fatalf("%q:\nCloudEvents decoder %s\nDecodeOutputs      %s", elem, want, got)
			}
		}
	})
}
