package hostproto

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"slices"
	"testing"
)

// stream is frames as the host writes them.
func stream(t testing.TB, frames ...[]any) []byte {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	for _, f := range frames {
		var parts [][]byte
		for _, p := range f[1:] {
			parts = append(parts, p.([]byte))
		}
		if err := w.WriteFrame(f[0].(byte), parts...); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

// testLimit bounds frames as the engine does, smaller.
func testLimit(kind byte) int {
	switch kind {
	case FrameResult:
		return 9 + 4096
	case FrameLog:
		return 4 + 1024
	default:
		return 4096
	}
}

func TestReaderLimitPerKind(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 2000)
	r := NewReader(bytes.NewReader(stream(t, []any{byte(FrameLog), Int32(1), big})))
	r.Limit = testLimit
	_, _, err := r.ReadFrame()
	var tl *FrameTooLargeError
	if !errors.As(err, &tl) || tl.Kind != FrameLog || tl.Size != 2004 || tl.Limit != 1028 {
		t.Fatalf("a 2 KB log frame: %v", err)
	}
	r = NewReader(bytes.NewReader(stream(t, []any{byte(FrameResult), Int32(0), []byte{1}, Int32(2000), big})))
	r.Limit = testLimit
	if kind, p, err := r.ReadFrame(); err != nil || kind != FrameResult || len(p) != 2009 {
		t.Fatalf("a result under its limit: %q %d %v", kind, len(p), err)
	}
}

// TestReaderDoesNotTrustTheHeader: a header announcing 192 MiB with a few
// bytes behind it costs next to nothing (the buffer grows as bytes come).
func TestReaderDoesNotTrustTheHeader(t *testing.T) {
	hdr := []byte{0, 0, 0, 12, FrameResult, 1, 2, 3} // 12<<24 bytes announced
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, err := NewReader(bytes.NewReader(hdr)).ReadFrame()
	runtime.ReadMemStats(&after)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err = %v", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Fatalf("reading a truncated 192 MiB frame allocated %d bytes", grew)
	}
}

// FuzzReadFrame: any byte stream from a host gives frames within their
// limits or an error, never a panic.
func FuzzReadFrame(f *testing.F) {
	f.Add(stream(f, []any{byte(FrameReady)}))
	f.Add(stream(f, []any{byte(FrameResult), Int32(-3), []byte{1}, Int32(2), []byte("ok")},
		[]any{byte(FrameLog), Int32(2), []byte("hello")}))
	f.Add(stream(f, []any{byte(FrameGatewayCall), LenPrefixed("svc"), LenPrefixed("v1/m"), []byte("req")}))
	f.Add([]byte{0xff, 0xff, 0xff, 0x0f, 'R'})
	f.Add([]byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := NewReader(bytes.NewReader(data))
		r.Limit = testLimit
		for range 64 {
			kind, p, err := r.ReadFrame()
			if err != nil {
				return
			}
			if len(p) > testLimit(kind) {
				t.Fatalf("frame %q of %d bytes over its limit", kind, len(p))
			}
			switch kind {
			case FrameResult:
				ParseResult(p)
			case FrameGatewayCall:
				ParseGatewayCall(p)
			case FrameLog, FrameGatewayReply:
				ParseInt32Prefixed(p)
			}
		}
	})
}

// FuzzParseResult: an 'R' payload parses or fails, and a parsed one's
// response lies inside the payload with the length the header says.
func FuzzParseResult(f *testing.F) {
	f.Add(slices.Concat(Int32(0), []byte{1}, Int32(2), []byte("ok")))
	f.Add(slices.Concat(Int32(5), []byte{0}, Int32(0)))
	f.Add(slices.Concat(Int32(0), []byte{1}, Int32(-1), []byte("x")))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, p []byte) {
		_, hasOut, outLen, out, err := ParseResult(p)
		if err != nil {
			return
		}
		if hasOut && outLen > 0 && int(outLen) != len(out) {
			t.Fatalf("header says %d, %d bytes", outLen, len(out))
		}
		if len(out) > len(p) {
			t.Fatal("out is longer than the payload")
		}
	})
}

// FuzzParseGatewayCall: a 'C' payload parses or fails, never reading past
// it.
func FuzzParseGatewayCall(f *testing.F) {
	f.Add(slices.Concat(LenPrefixed("svc"), LenPrefixed("v1/m"), []byte("req")))
	f.Add(slices.Concat(LenPrefixed("svc"), []byte{9, 0, 0, 0}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 'a'})
	f.Fuzz(func(t *testing.T, p []byte) {
		svc, method, req, err := ParseGatewayCall(p)
		if err != nil {
			return
		}
		if len(svc)+len(method)+len(req)+8 != len(p) {
			t.Fatalf("%d+%d+%d+8 bytes from a %d-byte payload", len(svc), len(method), len(req), len(p))
		}
	})
}
