//go:build !(linux || darwin || freebsd)

package loader

import (
	"fmt"
	"runtime"
)

// ErrUnsupportedOS is returned when loading a library on this platform.
var ErrUnsupportedOS = fmt.Errorf("native engine: loading libraries is not supported on %s yet", runtime.GOOS)

// Library is a loaded worker library; there are none on this platform.
type Library struct{}

// Open returns ErrUnsupportedOS.
func Open(string, Exports) (*Library, error) { return nil, ErrUnsupportedOS }

// Close does nothing.
func (*Library) Close() error { return nil }
