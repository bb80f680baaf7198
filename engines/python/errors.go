package python

import (
	"fmt"
	"strings"

	"github.com/virtufin/workmanager/engines"
)

// ErrClosed is returned by Process on a closed Instance, and by calls that
// were still running when Close stopped waiting for them.
var ErrClosed = fmt.Errorf("python engine: %w", engines.ErrClosed)

// Error is a failure reported for the worker's code: an exception it raised,
// code that does not load, or outputs that cannot be sent. errors.Is matches
// its Kind (engines.ErrInvalidCode or engines.ErrWorkerFailed); errors.As
// gives access to the Python traceback.
type Error struct {
	Kind error
	// Type is the Python exception type ("ValueError"); empty for problems
	// the engine itself found (bad outputs, no process function, ...).
	Type    string
	Message string
	// Traceback is the formatted Python traceback without the runner's own
	// frames; it may be empty.
	Traceback string
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
