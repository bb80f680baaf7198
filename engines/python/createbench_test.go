package python_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/python"
	"github.com/virtufin/workmanager/engines/sandbox/sandboxtest"
)

// BenchmarkPythonCreateOnSpares is what a node does for a create with a
// spare runner ready and idle (the strict sandbox, 300 ms between creates):
// Check, Load, the first call; the baseline of the native and .NET
// engines' CreateOnSpares benchmarks.
func BenchmarkPythonCreateOnSpares(b *testing.B) {
	e := newEngine(b, python.Config{Sandbox: sandboxtest.Strict(b), Spares: 2})
	enginetest.BenchCreate(b, e, func(i int) (engines.Spec, []byte) {
		return engines.Spec{WorkerID: fmt.Sprintf("w%d", i), MIMEType: python.MIMEType}, []byte(benchEcho)
	}, func() { time.Sleep(300 * time.Millisecond) })
}
