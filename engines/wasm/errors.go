package wasm

import (
	"errors"
	"fmt"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
)

// ErrClosed is returned by Process on a closed Instance, and by a call
// that Close cut off.
var ErrClosed = fmt.Errorf("wasm engine: %w", engines.ErrClosed)

// invalidError is bad worker code; it wraps engines.ErrInvalidCode.
type invalidError struct{ msg string }

func (e *invalidError) Error() string { return engines.ErrInvalidCode.Error() + ": " + e.msg }
func (e *invalidError) Unwrap() error { return engines.ErrInvalidCode }

func invalidf(format string, args ...any) error {
	return &invalidError{msg: fmt.Sprintf(format, args...)}
}

// WorkerError is a failure of one call: a non-zero return code of process
// and/or the error_message of its response, a trap (out-of-bounds access,
// unreachable, stack overflow, ...), an exit of the module, or a response
// the engine could not use. errors.Is(err, engines.ErrWorkerFailed) holds.
type WorkerError struct {
	// Code is process' return code (0 when there is none).
	Code int32
	// Message is the worker's error_message, the trap's message with the
	// module's stack, or what is wrong with the response.
	Message string
	// Trap: the call trapped or the module exited; its instance was
	// dropped (the next call gets a fresh one).
	Trap bool
	// InvalidOutput: the problem is the response's outputs
	// (engines.ErrInvalidOutput).
	InvalidOutput bool
}

func (e *WorkerError) Error() string {
	s := engines.ErrWorkerFailed.Error()
	if e.Code != 0 {
		s += fmt.Sprintf(": wasm worker returned code %d", e.Code)
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Unwrap makes the error match engines.ErrWorkerFailed.
func (e *WorkerError) Unwrap() error { return engines.ErrWorkerFailed }

// Is matches engines.ErrInvalidOutput when the outputs are the problem.
func (e *WorkerError) Is(target error) bool {
	return e.InvalidOutput && target == engines.ErrInvalidOutput
}

// WorkerTraceback is the worker's error text (engines.Traceback): the
// trap's message and wasm stack, or the worker's error_message.
func (e *WorkerError) WorkerTraceback() string {
	const max = 16 << 10
	if len(e.Message) > max {
		return e.Message[len(e.Message)-max:]
	}
	return e.Message
}

// withCode combines process' return code with the decoded response.
func withCode(rc int32, out []event.Event, err error) ([]event.Event, error) {
	if rc == 0 {
		return out, err
	}
	we := &WorkerError{Code: rc}
	var (
		werr   *WorkerError
		answer *engines.ErrorAnswer
	)
	switch {
	case errors.As(err, &werr):
		we.Message = werr.Message
	case errors.As(err, &answer):
		// A non-zero return code is a failure, whatever the response says.
		we.Message = answer.Message
	}
	return nil, we
}
