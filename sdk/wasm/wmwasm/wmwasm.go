// Package wmwasm is the Go side of WorkManager's WebAssembly worker ABI
// (MIME type application/wasm, ABI v1; sdk/wasm/README.md). A worker is a
// Go package main built with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o worker.wasm .
//
// that registers its handler in an init function (a reactor module runs
// its package initialisers, not main):
//
//	func init() {
//		wmwasm.Handle(func(ev *wmwasm.Event) ([]wmwasm.Output, error) {
//			return []wmwasm.Output{ev.Reply("greeting", []byte(`{"hello":"world"}`))}, nil
//		})
//	}
//
//	func main() {}
//
// The package exports the ABI's functions (abi_version, alloc, dealloc,
// process) and wraps the host's (Log, GatewayCall). The message codec
// (ParseEvent, BuildResponse) builds on every platform, so a handler can
// be tested with plain go test.
package wmwasm

import (
	"errors"
	"fmt"
	"os"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/virtufin/workmanager/sdk/native/abi"
)

// ABIVersion is the ABI this package implements.
const ABIVersion = 1

// Event is an input CloudEvent. Its byte slices and strings are copies:
// they stay valid after the call.
type Event struct {
	ID, Source, Type, SpecVersion, DataContentType, Subject, Time, DataSchema string
	Data                                                                      []byte
	// Extensions holds the extension attributes in their string form
	// (correlationid, traceparent, fencingtoken for a worker with a
	// group, ...).
	Extensions map[string]string
}

// CorrelationID is the event's correlationid extension ("" when none).
func (e *Event) CorrelationID() string { return e.Extensions["correlationid"] }

// FencingToken is the token of the group lock the call runs under (""
// for a worker without a group); GatewayCall sends it along by itself.
func (e *Event) FencingToken() string { return e.Extensions["fencingtoken"] }

// Reply is an output of type typ with JSON data that keeps the event's
// correlationid (the node would add it too).
func (e *Event) Reply(typ string, jsonData []byte) Output {
	o := Output{Type: typ, DataContentType: "application/json", Data: jsonData}
	if c := e.CorrelationID(); c != "" {
		o.Extensions = map[string]string{"correlationid": c}
	}
	return o
}

// Output is an output CloudEvent: it is published to the topic named by
// its Type. ID and Source may be left empty (the node fills them in).
type Output struct {
	ID, Source, Type, DataContentType, Subject, DataSchema string
	Data                                                   []byte
	Extensions                                             map[string]string
}

// Identity is the worker's id, group and topic (the only environment a
// module gets: VIRTUFIN_WORKER_ID, VIRTUFIN_WORKER_GROUP,
// VIRTUFIN_WORKER_TOPIC).
func Identity() (id, group, topic string) {
	return os.Getenv("VIRTUFIN_WORKER_ID"), os.Getenv("VIRTUFIN_WORKER_GROUP"), os.Getenv("VIRTUFIN_WORKER_TOPIC")
}

// Log levels of Log (those of the native ABI).
const (
	LevelTrace = 0
	LevelDebug = 1
	LevelInfo  = 2
	LevelWarn  = 3
	LevelError = 4
)

// Handler processes one event: its outputs (none is fine), or an error,
// which fails the attempt with its message (retried, then dead-lettered);
// an *Answer is the worker's own error answer instead.
type Handler func(ev *Event) ([]Output, error)

// Answer, returned by a Handler, answers the event with an error rather
// than failing it (the ABI's error_message with return code 0): the node
// publishes a worker.error event and Outputs as the error response (a
// default "<input type>.error" one when there are none); no retry.
type Answer struct {
	Message string
	Outputs []Output
}

func (a *Answer) Error() string { return a.Message }

var handler Handler

// Handle sets the worker's handler. Call it from an init function.
func Handle(h Handler) { handler = h }

// ParseEvent decodes an input CloudEvent buffer (the FlatBuffers table of
// sdk/native/worker_api.fbs). A malformed buffer is an error, not a
// panic.
func ParseEvent(buf []byte) (ev *Event, err error) {
	defer func() {
		if r := recover(); r != nil {
			ev, err = nil, fmt.Errorf("malformed input event (%d bytes): %v", len(buf), r)
		}
	}()
	if len(buf) < 8 {
		return nil, fmt.Errorf("malformed input event: %d bytes", len(buf))
	}
	ce := abi.GetRootAsCloudEvent(buf, 0)
	ev = &Event{ID: string(ce.Id()), Source: string(ce.Source()), Type: string(ce.Type()), SpecVersion: string(ce.Specversion()),
		DataContentType: string(ce.Datacontenttype()), Subject: string(ce.Subject()), Time: string(ce.Time()),
		DataSchema: string(ce.Dataschema())}
	if d := ce.DataBytes(); d != nil {
		ev.Data = append([]byte{}, d...)
	}
	if n := ce.ExtensionsLength(); n > 0 {
		if n > len(buf)/4 {
			return nil, errors.New("malformed input event: too many extensions")
		}
		ev.Extensions = make(map[string]string, n)
		var x abi.Extension
		for j := range n {
			if ce.Extensions(&x, j) {
				ev.Extensions[string(x.Key())] = string(x.Value())
			}
		}
	}
	return ev, nil
}

// BuildResponse encodes a WorkerResponse: the outputs and, when it is not
// empty, errMsg (the error_message: with return code 0 the worker's error
// answer, the outputs its error response; with another code a failure).
func BuildResponse(outs []Output, errMsg string) []byte {
	b := flatbuffers.NewBuilder(1024)
	var m flatbuffers.UOffsetT
	if errMsg != "" {
		m = b.CreateString(errMsg)
	}
	offs := make([]flatbuffers.UOffsetT, len(outs))
	for i := range outs {
		offs[i] = buildEvent(b, &outs[i])
	}
	var vec flatbuffers.UOffsetT
	if len(offs) > 0 {
		abi.WorkerResponseStartResultEventsVector(b, len(offs))
		for i := len(offs) - 1; i >= 0; i-- {
			b.PrependUOffsetT(offs[i])
		}
		vec = b.EndVector(len(offs))
	}
	abi.WorkerResponseStart(b)
	if m != 0 {
		abi.WorkerResponseAddErrorMessage(b, m)
	}
	if vec != 0 {
		abi.WorkerResponseAddResultEvents(b, vec)
	}
	b.Finish(abi.WorkerResponseEnd(b))
	return b.FinishedBytes()
}

func buildEvent(b *flatbuffers.Builder, o *Output) flatbuffers.UOffsetT {
	str := func(s string) flatbuffers.UOffsetT {
		if s == "" {
			return 0
		}
		return b.CreateString(s)
	}
	var exts []flatbuffers.UOffsetT
	for k, v := range o.Extensions {
		ko, vo := b.CreateString(k), b.CreateString(v)
		abi.ExtensionStart(b)
		abi.ExtensionAddKey(b, ko)
		abi.ExtensionAddValue(b, vo)
		exts = append(exts, abi.ExtensionEnd(b))
	}
	var extVec, data flatbuffers.UOffsetT
	if len(exts) > 0 {
		abi.CloudEventStartExtensionsVector(b, len(exts))
		for i := len(exts) - 1; i >= 0; i-- {
			b.PrependUOffsetT(exts[i])
		}
		extVec = b.EndVector(len(exts))
	}
	if o.Data != nil {
		data = b.CreateByteVector(o.Data)
	}
	id, source, typ, ct, subject, schema := str(o.ID), str(o.Source), str(o.Type), str(o.DataContentType), str(o.Subject), str(o.DataSchema)
	abi.CloudEventStart(b)
	if id != 0 {
		abi.CloudEventAddId(b, id)
	}
	if source != 0 {
		abi.CloudEventAddSource(b, source)
	}
	if typ != 0 {
		abi.CloudEventAddType(b, typ)
	}
	if ct != 0 {
		abi.CloudEventAddDatacontenttype(b, ct)
	}
	if subject != 0 {
		abi.CloudEventAddSubject(b, subject)
	}
	if data != 0 {
		abi.CloudEventAddData(b, data)
	}
	if extVec != 0 {
		abi.CloudEventAddExtensions(b, extVec)
	}
	if schema != 0 {
		abi.CloudEventAddDataschema(b, schema)
	}
	return abi.CloudEventEnd(b)
}

// run is process' logic: parse, call the handler (a panic is a failure
// with its message), encode.
func run(in []byte) (resp []byte, rc int32) {
	ev, err := ParseEvent(in)
	if err != nil {
		return BuildResponse(nil, err.Error()), 1
	}
	if handler == nil {
		return BuildResponse(nil, "wmwasm: no handler: call wmwasm.Handle in an init function"), 1
	}
	outs, err := safeCall(ev)
	var answer *Answer
	if errors.As(err, &answer) {
		msg := answer.Message
		if msg == "" {
			msg = "the handler answered with an error"
		}
		return BuildResponse(answer.Outputs, msg), 0
	}
	if err != nil {
		msg := err.Error()
		if msg == "" {
			msg = "the handler failed"
		}
		return BuildResponse(nil, msg), 1
	}
	if len(outs) == 0 {
		return nil, 0
	}
	return BuildResponse(outs, ""), 0
}

func safeCall(ev *Event) (outs []Output, err error) {
	defer func() {
		if r := recover(); r != nil {
			outs, err = nil, fmt.Errorf("panic: %v", r)
		}
	}()
	return handler(ev)
}

// GatewayError is a gateway call that did not succeed: Code is the
// host's (1 failed, 2 no gateway on the node, 3 bad arguments), Message
// its text.
type GatewayError struct {
	Code    int32
	Message string
}

func (e *GatewayError) Error() string {
	return fmt.Sprintf("gateway call failed (code %d): %s", e.Code, e.Message)
}
