//go:build !(linux || darwin || freebsd)

package native

import (
	"fmt"
	"os"
	"runtime"

	"github.com/virtufin/workmanager/engines"
)

var errUnsupportedOS = fmt.Errorf("native engine: loading libraries is not supported on %s yet", runtime.GOOS)

type library struct{}

func openLibrary(string, *Manifest) (*library, error) { return nil, errUnsupportedOS }
func (*library) close() error                         { return nil }

func (e *Engine) loadInProcess(engines.Spec, *pkg, abiSpec) (engines.Instance, error) {
	return nil, errUnsupportedOS
}

// HostMain is the main function of cmd/native-host; not supported here.
func HostMain([]string) int {
	fmt.Fprintln(os.Stderr, errUnsupportedOS)
	return 2
}
