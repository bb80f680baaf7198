package native

import (
	"context"
	"log/slog"
	"unsafe"
)

// The VirtufinHost struct of ABI v1 (see sdk/native/virtufin_worker_api.h).
// Its layout must match the C declaration on every 64-bit platform; the
// tests check the offsets.
type hostStructV1 struct {
	enginePtr    uintptr
	abiVersion   int32
	structSize   int32
	log          uintptr
	gatewayCall  uintptr
	freeResponse uintptr
	workerID     uintptr
	workerGroup  uintptr
	workerTopic  uintptr
}

const hostStructSizeV1 = int(unsafe.Sizeof(hostStructV1{}))

// Return codes of gateway_call (VIRTUFIN_GATEWAY_*).
const (
	gatewayOK          = 0
	gatewayError       = 1
	gatewayUnavailable = 2
	gatewayBadArgs     = 3
)

// maxLogLine bounds one log line read from native memory.
const maxLogLine = 64 << 10

// slogLevel maps VIRTUFIN_LOG_* to slog levels.
func slogLevel(level int32) slog.Level {
	switch {
	case level <= 0:
		return slog.LevelDebug - 4
	case level == 1:
		return slog.LevelDebug
	case level == 2:
		return slog.LevelInfo
	case level == 3:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

// gatewayCall runs one gateway call for a sink: ctx bounds it.
func gatewayCall(ctx context.Context, gw interface {
	Call(ctx context.Context, service, method string, request []byte) ([]byte, error)
}, service, method string, req []byte) ([]byte, int32) {
	if gw == nil {
		return []byte("no gateway is configured on this node"), gatewayUnavailable
	}
	resp, err := gw.Call(ctx, service, method, req)
	if err != nil {
		msg := err.Error()
		if msg == "" {
			msg = "gateway call failed"
		}
		return []byte(msg), gatewayError
	}
	return resp, gatewayOK
}
