package wmwasm

import (
	"errors"
	"strings"
	"testing"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/virtufin/workmanager/sdk/native/abi"
)

// event encodes a CloudEvent as the engine does.
func event(id, typ string, data []byte, ext map[string]string) []byte {
	b := flatbuffers.NewBuilder(256)
	var exts []flatbuffers.UOffsetT
	for k, v := range ext {
		ko, vo := b.CreateString(k), b.CreateString(v)
		abi.ExtensionStart(b)
		abi.ExtensionAddKey(b, ko)
		abi.ExtensionAddValue(b, vo)
		exts = append(exts, abi.ExtensionEnd(b))
	}
	abi.CloudEventStartExtensionsVector(b, len(exts))
	for i := len(exts) - 1; i >= 0; i-- {
		b.PrependUOffsetT(exts[i])
	}
	ev := b.EndVector(len(exts))
	d := b.CreateByteVector(data)
	io, to := b.CreateString(id), b.CreateString(typ)
	abi.CloudEventStart(b)
	abi.CloudEventAddId(b, io)
	abi.CloudEventAddType(b, to)
	abi.CloudEventAddData(b, d)
	abi.CloudEventAddExtensions(b, ev)
	b.Finish(abi.CloudEventEnd(b))
	return b.FinishedBytes()
}

func TestRunCallsTheHandlerAndEncodesItsOutputs(t *testing.T) {
	Handle(func(ev *Event) ([]Output, error) {
		if ev.Type == "fail" {
			return nil, errors.New("boom")
		}
		if ev.Type == "panic" {
			panic("oops")
		}
		return []Output{ev.Reply("done", ev.Data)}, nil
	})
	defer Handle(nil)
	resp, rc := run(event("e-1", "go", []byte(`{"x":1}`), map[string]string{"correlationid": "c-1"}))
	if rc != 0 {
		t.Fatalf("rc = %d", rc)
	}
	r := abi.GetRootAsWorkerResponse(resp, 0)
	var ce abi.CloudEvent
	if r.ResultEventsLength() != 1 || !r.ResultEvents(&ce, 0) {
		t.Fatalf("%d outputs", r.ResultEventsLength())
	}
	var x abi.Extension
	if string(ce.Type()) != "done" || string(ce.DataBytes()) != `{"x":1}` || ce.ExtensionsLength() != 1 ||
		!ce.Extensions(&x, 0) || string(x.Value()) != "c-1" {
		t.Fatalf("output type %q data %q", ce.Type(), ce.DataBytes())
	}
	for typ, want := range map[string]string{"fail": "boom", "panic": "panic: oops"} {
		resp, _ := run(event("e-2", typ, nil, nil))
		if msg := string(abi.GetRootAsWorkerResponse(resp, 0).ErrorMessage()); !strings.Contains(msg, want) {
			t.Errorf("%s: error_message %q, want %q", typ, msg, want)
		}
	}
	if _, err := ParseEvent([]byte{1, 2, 3}); err == nil {
		t.Error("ParseEvent of 3 bytes succeeded")
	}
	if _, err := ParseEvent([]byte{0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0}); err == nil {
		t.Error("ParseEvent of a forged root succeeded")
	}
}
