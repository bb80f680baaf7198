package loader

import (
	"slices"
	"testing"
	"unsafe"
)

// TestHostStructLayout pins the VirtufinHost offsets documented in
// virtufin_worker_api.h.
func TestHostStructLayout(t *testing.T) {
	var h hostStructV1
	got := []uintptr{unsafe.Offsetof(h.enginePtr), unsafe.Offsetof(h.abiVersion), unsafe.Offsetof(h.structSize),
		unsafe.Offsetof(h.log), unsafe.Offsetof(h.gatewayCall), unsafe.Offsetof(h.freeResponse),
		unsafe.Offsetof(h.workerID), unsafe.Offsetof(h.workerGroup), unsafe.Offsetof(h.workerTopic), unsafe.Sizeof(h)}
	want := []uintptr{0, 8, 12, 16, 24, 32, 40, 48, 56, 64}
	if !slices.Equal(got, want) {
		t.Fatalf("offsets = %v, want %v", got, want)
	}
}
