//go:build !wasip1

package wmwasm

import (
	"fmt"
	"os"
)

// Outside WebAssembly (a handler's own tests) there is no host: Log
// writes to stderr and GatewayCall answers code 2 (no gateway).

// Log writes msg to stderr with its level.
func Log(level int32, msg string) { fmt.Fprintf(os.Stderr, "wmwasm log %d: %s\n", level, msg) }

// GatewayCall fails with code 2: there is no gateway outside the node.
func GatewayCall(service, method string, request []byte) ([]byte, error) {
	return nil, &GatewayError{Code: 2, Message: "no gateway outside a WorkManager node"}
}
