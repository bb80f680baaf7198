package wire

import (
	"bytes"
	"context"
	"errors"
	"io"
	"runtime"
	"testing"

	"github.com/virtufin/workmanager/engines"
)

// FuzzDecodeOutputs: any 'R' payload from a child decodes to events that
// have a type, or to an *Error of kind ErrWorkerFailed; never a panic.
func FuzzDecodeOutputs(f *testing.F) {
	f.Add([]byte(`null`))
	f.Add([]byte(`{"type":"t","specversion":"1.0","data":{"a":1}}`))
	f.Add([]byte(`[{"type":"a"},{"type":"b","data_base64":"aGk="}]`))
	f.Add([]byte(`[{"id":"x"}]`))
	f.Add([]byte(` [ ] `))
	f.Add([]byte(`{"type":"t","time":"not a time"}`))
	f.Add([]byte(`[`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		out, err := DecodeOutputs(payload, 1<<20)
		if err != nil {
			var werr *Error
			if !errors.As(err, &werr) || !errors.Is(err, engines.ErrWorkerFailed) {
				t.Fatalf("error %v is not a worker failure", err)
			}
			return
		}
		for i := range out {
			if out[i].Type() == "" {
				t.Fatalf("output %d has no type", i)
			}
		}
	})
}

// FuzzDecodeError: any 'X' payload gives an error of the given kind.
func FuzzDecodeError(f *testing.F) {
	f.Add([]byte(`{"type":"ValueError","message":"bad","traceback":"..."}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`"x"`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		if err := DecodeError(engines.ErrWorkerFailed, payload); !errors.Is(err, engines.ErrWorkerFailed) {
			t.Fatalf("DecodeError = %v", err)
		}
	})
}

type echoGateway struct{}

func (echoGateway) Call(_ context.Context, service, method string, req []byte) ([]byte, error) {
	return append([]byte(service+"/"+method+":"), req...), nil
}

// FuzzServeGateway: any 'G' payload gets an answer (0 and a response, or
// 1 and a message), never a panic; targets are enforced.
func FuzzServeGateway(f *testing.F) {
	f.Add([]byte("{\"service\":\"billing\",\"method\":\"charge\"}\n{}"))
	f.Add([]byte("{\"service\":\"users\",\"method\":\"x\"}\nbody"))
	f.Add([]byte("no newline"))
	f.Fuzz(func(t *testing.T, payload []byte) {
		resp := ServeGateway(context.Background(), echoGateway{}, []string{"billing/*"}, payload)
		if len(resp) == 0 || resp[0] > 1 {
			t.Fatalf("answer %q", resp)
		}
		if resp[0] == 0 && !bytes.HasPrefix(resp[1:], []byte("billing/")) {
			t.Fatalf("a call outside the targets was made: %q", resp)
		}
	})
}

// FuzzReadPayload: a payload of n bytes from any stream is read whole or
// fails with io.ErrUnexpectedEOF, and costs at most about twice the bytes
// that arrived.
func FuzzReadPayload(f *testing.F) {
	f.Add([]byte("hello"), uint32(5))
	f.Add([]byte("hel"), uint32(5))
	f.Add([]byte{}, uint32(1<<30))
	f.Fuzz(func(t *testing.T, data []byte, n uint32) {
		n %= 1 << 30
		b, err := ReadPayload(bytes.NewReader(data), nil, int(n))
		if int(n) <= len(data) {
			if err != nil || !bytes.Equal(b, data[:n]) {
				t.Fatalf("ReadPayload(%d of %d) = %d bytes, %v", n, len(data), len(b), err)
			}
			return
		}
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("short stream: %v", err)
		}
	})
}

func TestReadPayloadGrowsAsBytesArrive(t *testing.T) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := ReadPayload(bytes.NewReader(make([]byte, 100)), nil, 512<<20)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err = %v", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Fatalf("100 bytes of an announced 512 MiB allocated %d bytes", grew)
	}
	data := bytes.Repeat([]byte("abc"), 100000)
	b, err := ReadPayload(bytes.NewReader(data), make([]byte, 0, 16), len(data))
	if err != nil || !bytes.Equal(b, data) {
		t.Fatalf("whole payload: %d bytes, %v", len(b), err)
	}
}

func TestChildFrameLimit(t *testing.T) {
	for kind, want := range map[byte]int{KindResult: 1000, KindError: 1000, KindGateway: 1000, KindHello: smallFrame, KindOK: smallFrame, 'Z': smallFrame} {
		if got := ChildFrameLimit(kind, 1000); got != want {
			t.Errorf("ChildFrameLimit(%q) = %d, want %d", kind, got, want)
		}
	}
	if got := ChildFrameLimit(KindResult, 0); got != MaxFrame {
		t.Errorf("no limit: %d", got)
	}
	err := &FrameTooLargeError{Kind: KindResult, Size: 5000, Limit: 1000}
	if !errors.Is(err, engines.ErrReplyTooLarge) {
		t.Error("FrameTooLargeError is not ErrReplyTooLarge")
	}
}
