package native

import (
	"errors"
	"fmt"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
)

// ErrClosed is returned by Process on a closed Instance.
var ErrClosed = fmt.Errorf("native engine: %w", engines.ErrClosed)

// invalidError is bad worker code; it wraps engines.ErrInvalidCode.
type invalidError struct{ msg string }

func (e *invalidError) Error() string { return engines.ErrInvalidCode.Error() + ": " + e.msg }
func (e *invalidError) Unwrap() error { return engines.ErrInvalidCode }

// WorkerError is a failure the worker reported for one event: a non-zero
// return code of Process and/or the error_message of its response, or a
// response the engine could not use. errors.Is(err, engines.ErrWorkerFailed)
// holds.
type WorkerError struct {
	// Code is Process' return code (0 when the worker returned 0 with an
	// error_message, or when the problem is the response itself).
	Code int32
	// Message is the worker's error_message, or what is wrong with its
	// response; may be empty.
	Message string
	// InvalidOutput: the problem is the response's outputs
	// (engines.ErrInvalidOutput), not an error the worker reported.
	InvalidOutput bool
}

func (e *WorkerError) Error() string {
	s := engines.ErrWorkerFailed.Error()
	if e.Code != 0 {
		s += fmt.Sprintf(": native worker returned code %d", e.Code)
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

func (e *WorkerError) Unwrap() error { return engines.ErrWorkerFailed }

// Is matches engines.ErrInvalidOutput when the outputs are the problem.
func (e *WorkerError) Is(target error) bool {
	return e.InvalidOutput && target == engines.ErrInvalidOutput
}

// WorkerTraceback is the worker's error text (engines.Traceback): a native
// worker reports no stack.
func (e *WorkerError) WorkerTraceback() string { return e.Message }

// withCode combines Process' return code with the decoded response.
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
