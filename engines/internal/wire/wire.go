// Package wire owns what the engines that run workers in child processes
// (Python's runner, the .NET host) share about their framed protocol: the
// worker error type, decoding a reply's outputs and error report, serving a
// worker's gateway call, and forwarding the child's output lines to slog.
package wire

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/virtufin/workmanager/engines"
)

// Frame kinds. A frame is a 4-byte little-endian payload length, the kind
// byte and the payload.
const (
	KindLoad   = 'L' // node -> child: the code to load
	KindSetup  = 'S' // node -> child, before KindLoad: a spare runner's worker settings (Python)
	KindEvent  = 'E' // node -> child: one CloudEvent, structured JSON
	KindHello  = 'H' // child -> node: started; payload describes the runtime
	KindOK     = 'K' // child -> node: code loaded
	KindResult = 'R' // child -> node: JSON null, one event object or a list
	KindError  = 'X' // child -> node: JSON {"type", "message", "traceback"}
	// During an event: the worker calls a backend through the node.
	KindGateway      = 'G' // child -> node: JSON {"service", "method"}, '\n', body
	KindGatewayReply = 'g' // node -> child: 0 and the response, or 1 and an error

	HeaderSize = 5
	// MaxFrame bounds a frame's payload; a bigger length is a protocol error.
	MaxFrame = 1 << 30
)

// Error is a failure reported for the worker's code: an exception it raised,
// code that does not load, or outputs that cannot be sent. errors.Is matches
// its Kind (engines.ErrInvalidCode or engines.ErrWorkerFailed); errors.As
// gives access to the traceback.
type Error struct {
	Kind error
	// Type is the exception type ("ValueError", "InvalidOperationException");
	// empty for problems the engine itself found (bad outputs, no worker, ...).
	Type    string
	Message string
	// Traceback is the formatted stack of the exception without the
	// runner's or host's own frames; it may be empty.
	Traceback string
	// InvalidOutput: the call returned outputs that cannot be published
	// (engines.ErrInvalidOutput), found by the engine or reported by the
	// worker process ("invalid_output" in its error report).
	InvalidOutput bool
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Kind != nil {
		b.WriteString(e.Kind.Error())
		b.WriteString(": ")
	}
	switch {
	case e.Type != "" && e.Message != "":
		b.WriteString(e.Type)
		b.WriteString(": ")
		b.WriteString(e.Message)
	case e.Type != "":
		b.WriteString(e.Type)
	default:
		b.WriteString(e.Message)
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Kind }

// Is matches engines.ErrInvalidOutput when the error is about the outputs.
func (e *Error) Is(target error) bool {
	return e.InvalidOutput && target == engines.ErrInvalidOutput
}

// WorkerTraceback is the traceback (engines.Traceback).
func (e *Error) WorkerTraceback() string { return e.Traceback }

// ServeGatewayUntil is ServeGateway on a context that also ends at
// deadline (the call's) and when closed ends (the instance's): a backend
// call cannot outlive the call it was made for (its timeout, its retry) or
// the instance's Close. expired says the deadline ended it: the call is
// then a timeout, whichever of the gateway and the caller's timer saw it
// first, and the caller kills the process.
func ServeGatewayUntil(ctx, closed context.Context, deadline time.Time, gw engines.Gateway, targets []string, payload []byte) (reply []byte, expired bool) {
	gctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	stop := context.AfterFunc(closed, cancel)
	defer stop()
	reply = ServeGateway(gctx, gw, targets, payload)
	return reply, errors.Is(gctx.Err(), context.DeadlineExceeded)
}

// ServeGateway serves one gateway call of a worker: payload is
// `{"service","method"}\n<body>`; the answer (the 'g' payload) is 0 and the
// response body, or 1 and an error message for the worker. The call is held
// to targets (engines.CheckGatewayTarget) and made with ctx, the event's
// (it carries the group lock's fence).
func ServeGateway(ctx context.Context, gw engines.Gateway, targets []string, payload []byte) []byte {
	fail := func(format string, args ...any) []byte { return append([]byte{1}, fmt.Sprintf(format, args...)...) }
	head, body, ok := bytes.Cut(payload, []byte("\n"))
	var target struct{ Service, Method string }
	if !ok || json.Unmarshal(head, &target) != nil || target.Service == "" || target.Method == "" {
		return fail("malformed gateway call")
	}
	if gw == nil {
		return fail("no gateway is configured on this node")
	}
	if err := engines.CheckGatewayTarget(targets, target.Service, target.Method); err != nil {
		return fail("%v", err)
	}
	resp, err := gw.Call(engines.WithGatewayTargets(ctx, targets), target.Service, target.Method, body)
	if err != nil {
		return fail("%v", err)
	}
	return append([]byte{0}, resp...)
}
