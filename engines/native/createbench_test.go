//go:build linux

package native

import (
	"fmt"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/sandbox/sandboxtest"
)

// BenchmarkNativeCreateOnSpares is what a node does for a create of a
// native package with its spare check host ready and idle (the strict
// sandbox; a spare is ready as soon as its process started, so each create
// waits 300 ms more, untimed, for its runtime to be up): Check, Load, the
// first call; in process and in a host. BenchmarkPythonCreateOnSpares is
// the same for Python.
func BenchmarkNativeCreateOnSpares(b *testing.B) {
	for _, iso := range []Isolation{IsolationInProcess, IsolationProcess} {
		b.Run(string(iso), func(b *testing.B) {
			e := newTestEngine(b, hostConfig(Config{Sandbox: sandboxtest.Strict(b), SpareCheckHosts: 1, Isolation: iso}))
			b.Cleanup(func() { _ = e.Close() })
			compileAll(b, flagsEcho)
			code := packageOf(b, flagsEcho, nil)
			enginetest.BenchCreate(b, e, func(i int) (engines.Spec, []byte) {
				spec := testSpec
				spec.WorkerID = fmt.Sprintf("w%d", i)
				return spec, code
			}, func() {
				for len(e.spareHosts.Ready()) == 0 {
					time.Sleep(2 * time.Millisecond)
				}
				time.Sleep(300 * time.Millisecond)
			})
		})
	}
}
