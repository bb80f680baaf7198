package hostproto

import (
	"bytes"
	"slices"
	"testing"
)

func TestFramesRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	if err := w.WriteFrame(FrameResult, Int32(-3), []byte{1}, Int32(2), []byte("ok")); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteFrame(FrameGatewayCall, LenPrefixed("svc"), LenPrefixed("v1/m"), []byte("req")); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteFrame(FrameLog, Int32(2), []byte("hello")); err != nil {
		t.Fatal(err)
	}
	r := NewReader(&buf)

	kind, p, err := r.ReadFrame()
	if err != nil || kind != FrameResult {
		t.Fatalf("frame 1: %q, %v", kind, err)
	}
	rc, hasOut, outLen, out, err := ParseResult(p)
	if err != nil || rc != -3 || !hasOut || outLen != 2 || string(out) != "ok" {
		t.Fatalf("result = %d %v %d %q %v", rc, hasOut, outLen, out, err)
	}

	kind, p, err = r.ReadFrame()
	if err != nil || kind != FrameGatewayCall {
		t.Fatalf("frame 2: %q, %v", kind, err)
	}
	svc, method, req, err := ParseGatewayCall(p)
	if err != nil || svc != "svc" || method != "v1/m" || string(req) != "req" {
		t.Fatalf("gateway call = %q %q %q %v", svc, method, req, err)
	}

	kind, p, err = r.ReadFrame()
	if err != nil || kind != FrameLog {
		t.Fatalf("frame 3: %q, %v", kind, err)
	}
	if level, msg, ok := ParseInt32Prefixed(p); !ok || level != 2 || string(msg) != "hello" {
		t.Fatalf("log = %d %q %v", level, msg, ok)
	}
	if _, _, ok := ParseInt32Prefixed([]byte{1, 2}); ok {
		t.Fatal("a short payload parsed")
	}
	if _, _, _, err := ParseGatewayCall(slices.Concat(LenPrefixed("svc"), []byte{9, 0, 0, 0})); err == nil {
		t.Fatal("a truncated gateway call parsed")
	}
}
