// Package sandboxtest gives tests a real sandbox in strict mode (every OS
// layer of engines/sandbox).
package sandboxtest

import (
	"context"
	"log/slog"
	"os"
	"testing"

	"github.com/virtufin/workmanager/engines/sandbox"
)

// RequireEnv, when set (make test does as root), turns a missing layer into
// a failure instead of a skip.
const RequireEnv = "WM_REQUIRE_SANDBOX"

// Strict returns a strict sandbox with the default limits and /tmp and
// /scratch sizes, except a 16 MiB file size (a test that fills the disk
// writes that much, not 100 MiB). Where the layers cannot exist (not root, no bubblewrap)
// it skips tb, unless RequireEnv is set.
func Strict(tb testing.TB) *sandbox.Sandbox {
	tb.Helper()
	limits := sandbox.DefaultLimits
	limits.FileSize = 16 << 20
	s, err := sandbox.New(context.Background(), sandbox.Config{Mode: sandbox.Strict, Log: slog.New(slog.DiscardHandler),
		Limits: limits})
	if err != nil {
		if os.Getenv(RequireEnv) != "" {
			tb.Fatal(err)
		}
		tb.Skip(err)
	}
	return s
}
