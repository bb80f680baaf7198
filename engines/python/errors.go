package python

import (
	"fmt"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/internal/wire"
)

// ErrClosed is returned by Process on a closed Instance, and by calls that
// were still running when Close stopped waiting for them.
var ErrClosed = fmt.Errorf("python engine: %w", engines.ErrClosed)

// Error is a failure reported for the worker's code (an exception it
// raised, code that does not load, outputs that cannot be sent); errors.As
// gives access to the Python traceback.
type Error = wire.Error
