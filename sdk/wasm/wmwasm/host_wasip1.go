//go:build wasip1

package wmwasm

import (
	"unsafe"
)

// The ABI's exports and the host's imports (sdk/wasm/README.md).

// pinned keeps every buffer handed to the host (alloc's, responses)
// reachable until dealloc: Go's collector does not move objects, so their
// addresses stay valid.
var pinned = map[uintptr][]byte{}

func pin(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		b = make([]byte, 1)
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	pinned[uintptr(p)] = b
	return p
}

//go:wasmexport abi_version
func abiVersion() int32 { return ABIVersion }

//go:wasmexport alloc
func alloc(size int32) unsafe.Pointer {
	if size < 0 {
		return nil
	}
	return pin(make([]byte, size))
}

//go:wasmexport dealloc
func dealloc(p unsafe.Pointer) { delete(pinned, uintptr(p)) }

// lastResponse is the previous call's response: the engine copied it
// when that call returned, it is released when the next one starts.
var lastResponse unsafe.Pointer

//go:wasmexport process
func process(in unsafe.Pointer, inLen int32, out unsafe.Pointer, outLen unsafe.Pointer) int32 {
	if lastResponse != nil {
		delete(pinned, uintptr(lastResponse))
		lastResponse = nil
	}
	resp, rc := run(unsafe.Slice((*byte)(in), inLen))
	if resp != nil {
		lastResponse = pin(resp)
		*(*unsafe.Pointer)(out) = lastResponse
		*(*int32)(outLen) = int32(len(resp))
	}
	return rc
}

//go:wasmimport workmanager log
func hostLog(level int32, msg unsafe.Pointer, n int32)

//go:wasmimport workmanager gateway_call
func hostGatewayCall(svc unsafe.Pointer, svcLen int32, method unsafe.Pointer, methodLen int32, req unsafe.Pointer, reqLen int32) int64

//go:wasmimport workmanager gateway_response
func hostGatewayResponse(buf unsafe.Pointer, n int32) int32

// Log sends one line to the worker's log at level (LevelTrace ..
// LevelError).
func Log(level int32, msg string) {
	hostLog(level, unsafe.Pointer(unsafe.StringData(msg)), int32(len(msg)))
}

// GatewayCall calls service/method through the node's gateway (JSON by
// convention), under the worker's allowed_gateway_targets and, for a
// worker with a group, the call's fencing token. A failure is a
// *GatewayError.
func GatewayCall(service, method string, request []byte) ([]byte, error) {
	r := hostGatewayCall(unsafe.Pointer(unsafe.StringData(service)), int32(len(service)),
		unsafe.Pointer(unsafe.StringData(method)), int32(len(method)),
		unsafe.Pointer(unsafe.SliceData(request)), int32(len(request)))
	code, n := int32(r>>32), int32(uint32(r))
	var resp []byte
	if n > 0 {
		resp = make([]byte, n)
		got := hostGatewayResponse(unsafe.Pointer(unsafe.SliceData(resp)), n)
		if got < 0 {
			return nil, &GatewayError{Code: 1, Message: "the response could not be copied"}
		}
		resp = resp[:got]
	}
	if code != 0 {
		return nil, &GatewayError{Code: code, Message: string(resp)}
	}
	return resp, nil
}
