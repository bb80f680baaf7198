package native

import (
	"context"
	"log/slog"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/native/internal/loader"
)

// The engine's side of the worker's host functions, for in-process and
// isolated workers alike: where log lines go and how gateway_call is served.

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

// gatewayCall runs one gateway call for a worker (its spec holds the
// allowed targets): ctx bounds it. It returns the response (or an error
// message) and a VIRTUFIN_GATEWAY_* code.
func gatewayCall(ctx context.Context, gw interface {
	Call(ctx context.Context, service, method string, request []byte) ([]byte, error)
}, spec engines.Spec, service, method string, req []byte) ([]byte, int32) {
	if gw == nil {
		return []byte("no gateway is configured on this node"), loader.GatewayUnavailable
	}
	if err := engines.CheckGatewayTarget(spec.GatewayTargets, service, method); err != nil {
		return []byte(err.Error()), loader.GatewayError
	}
	resp, err := gw.Call(engines.WithGatewayTargets(ctx, spec.GatewayTargets), service, method, req)
	if err != nil {
		msg := err.Error()
		if msg == "" {
			msg = "gateway call failed"
		}
		return []byte(msg), loader.GatewayError
	}
	return resp, loader.GatewayOK
}
