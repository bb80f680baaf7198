package loader

import "unsafe"

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
	GatewayOK          = 0
	GatewayError       = 1
	GatewayUnavailable = 2
	GatewayBadArgs     = 3
)

// MaxLogLine bounds one log line read from native memory.
const MaxLogLine = 64 << 10

// maxGatewayName bounds service and method names read from native memory.
const maxGatewayName = 4 << 10
