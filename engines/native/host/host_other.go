//go:build !(linux || darwin || freebsd)

package host

import (
	"fmt"
	"os"

	"github.com/virtufin/workmanager/engines/native/internal/loader"
)

// Main is the main function of cmd/native-host; not supported here.
func Main([]string) int {
	fmt.Fprintln(os.Stderr, loader.ErrUnsupportedOS)
	return 2
}
