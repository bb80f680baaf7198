//go:build linux || darwin || freebsd

package loader

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Sink receives the host calls of one loaded worker: an in-process
// instance, or the host side of a native-host child process.
type Sink interface {
	HostLog(level int32, msg string)
	// HostGateway returns the response (or an error message) and a
	// VIRTUFIN_GATEWAY_* code.
	HostGateway(service, method string, req []byte) ([]byte, int32)
}

// sinks maps engine_ptr handles to their sink. engine_ptr is never a Go
// pointer: native code only ever gets this number back to us.
var (
	sinks    sync.Map // uintptr -> Sink
	nextSink atomic.Uintptr
)

// RegisterSink returns a new engine_ptr handle that routes to s.
func RegisterSink(s Sink) uintptr {
	id := nextSink.Add(1)
	sinks.Store(id, s)
	return id
}

// UnregisterSink drops a handle: host calls made with it are refused.
func UnregisterSink(id uintptr) { sinks.Delete(id) }

// Registered reports whether a handle routes to a sink.
func Registered(id uintptr) bool { return lookupSink(id) != nil }

func lookupSink(id uintptr) Sink {
	s, ok := sinks.Load(id)
	if !ok {
		return nil
	}
	return s.(Sink)
}

// Runtime is created once per process: libc's malloc/free and the three
// host callbacks (purego callbacks cannot be freed and are limited in
// number, so they are shared by every loaded worker and routed through
// engine_ptr).
type Runtime struct {
	malloc, free     uintptr
	logCB, gatewayCB uintptr
	freeResponseCB   uintptr // libc free: responses are malloc'd
}

var (
	rtOnce sync.Once
	rt     *Runtime
	rtErr  error
)

// Init loads the C library and creates the host callbacks, once per
// process; later calls return the same Runtime (or error).
func Init() (*Runtime, error) {
	rtOnce.Do(func() {
		var libc uintptr
		var errs []string
		for _, name := range libcNames() {
			h, err := purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_GLOBAL)
			if err == nil {
				libc = h
				break
			}
			errs = append(errs, err.Error())
		}
		if libc == 0 {
			rtErr = fmt.Errorf("native engine: cannot load the C library: %s", strings.Join(errs, "; "))
			return
		}
		s := &Runtime{}
		var err error
		if s.malloc, err = purego.Dlsym(libc, "malloc"); err != nil {
			rtErr = fmt.Errorf("native engine: %w", err)
			return
		}
		if s.free, err = purego.Dlsym(libc, "free"); err != nil {
			rtErr = fmt.Errorf("native engine: %w", err)
			return
		}
		s.freeResponseCB = s.free
		s.logCB = purego.NewCallback(hostLogCallback)
		s.gatewayCB = purego.NewCallback(hostGatewayCallback)
		rt = s
	})
	return rt, rtErr
}

func libcNames() []string {
	switch runtime.GOOS {
	case "darwin":
		return []string{"/usr/lib/libSystem.B.dylib"}
	case "freebsd":
		return []string{"libc.so.7"}
	default:
		return []string{"libc.so.6", "libc.so", "libc.musl-x86_64.so.1", "libc.musl-aarch64.so.1"}
	}
}

func (s *Runtime) cmalloc(n int) unsafe.Pointer {
	if n <= 0 {
		n = 1
	}
	p, _, _ := purego.SyscallN(s.malloc, uintptr(n))
	return cptr(p)
}

func (s *Runtime) cfree(p unsafe.Pointer) {
	if p != nil {
		purego.SyscallN(s.free, uintptr(p))
	}
}

// cptr turns an address returned by native code into a pointer. The memory
// is not Go memory; the indirection keeps vet's unsafeptr check quiet about
// a conversion that is correct here.
func cptr(u uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&u)) }

// goStringN copies a NUL-terminated C string of at most max bytes.
func goStringN(p unsafe.Pointer, max int) string {
	if p == nil {
		return ""
	}
	n := 0
	for n < max && *(*byte)(unsafe.Add(p, n)) != 0 {
		n++
	}
	return string(unsafe.Slice((*byte)(p), n))
}

// hostLogCallback is VirtufinHost.log.
func hostLogCallback(enginePtr uintptr, level int32, msg unsafe.Pointer) {
	s := lookupSink(enginePtr)
	if s == nil || msg == nil {
		return
	}
	s.HostLog(level, goStringN(msg, MaxLogLine))
}

// hostGatewayCallback is VirtufinHost.gateway_call.
func hostGatewayCallback(enginePtr uintptr, service, method, req unsafe.Pointer, reqLen int32,
	resp, respLen unsafe.Pointer) int32 {
	if resp != nil {
		*(*uintptr)(resp) = 0
	}
	if respLen != nil {
		*(*int32)(respLen) = 0
	}
	if resp == nil || respLen == nil || service == nil || method == nil || reqLen < 0 || (req == nil && reqLen > 0) {
		return GatewayBadArgs
	}
	s := lookupSink(enginePtr)
	if s == nil {
		return GatewayUnavailable
	}
	var body []byte
	if reqLen > 0 {
		body = unsafe.Slice((*byte)(req), reqLen)
	}
	out, code := s.HostGateway(goStringN(service, maxGatewayName), goStringN(method, maxGatewayName), body)
	if len(out) > 0 {
		r := rt.cmalloc(len(out))
		if r == nil {
			return GatewayError
		}
		copy(unsafe.Slice((*byte)(r), len(out)), out)
		*(*unsafe.Pointer)(resp) = r
		*(*int32)(respLen) = int32(len(out))
	}
	return code
}

// Host is one VirtufinHost in C memory (with its identity strings), alive
// as long as the library is loaded.
type Host struct {
	rt *Runtime
	p  unsafe.Pointer
}

// NewHost allocates the host struct passed to every call of one loaded
// worker: its engine_ptr is sinkID. It returns nil when malloc fails.
func (s *Runtime) NewHost(abi ABI, sinkID uintptr, workerID, group, topic string) *Host {
	strs := []string{workerID, group, topic}
	size := hostStructSizeV1
	for _, v := range strs {
		size += len(v) + 1
	}
	p := s.cmalloc(size)
	if p == nil {
		return nil
	}
	mem := unsafe.Slice((*byte)(p), size)
	clear(mem)
	h := (*hostStructV1)(p)
	h.enginePtr = sinkID
	h.abiVersion = int32(abi.Version)
	h.structSize = int32(hostStructSizeV1)
	h.log = s.logCB
	h.gatewayCall = s.gatewayCB
	h.freeResponse = s.freeResponseCB
	off := hostStructSizeV1
	ptrs := []*uintptr{&h.workerID, &h.workerGroup, &h.workerTopic}
	for i, v := range strs {
		copy(mem[off:], v)
		mem[off+len(v)] = 0
		*ptrs[i] = uintptr(unsafe.Add(p, off))
		off += len(v) + 1
	}
	return &Host{rt: s, p: p}
}

// Addr is the host struct's address, the first argument of Process.
func (h *Host) Addr() uintptr { return uintptr(h.p) }

// Release frees the host struct; h may be nil.
func (h *Host) Release() {
	if h != nil && h.p != nil {
		h.rt.cfree(h.p)
		h.p = nil
	}
}

// Library is one dlopen'ed worker library.
type Library struct {
	handle     uintptr
	process    uintptr
	freeResult uintptr
}

// Open loads path and resolves the exports. A library that does not load
// (the error has the dynamic loader's message) or lacks exports (named) is
// a *LibraryError.
func Open(path string, ex Exports) (*Library, error) {
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, libraryErrorf("the library %s does not load: %v", ex.fileName(runtime.GOOS), err)
	}
	l := &Library{handle: h}
	var missing []string
	for _, sym := range []struct {
		name string
		dst  *uintptr
	}{{ex.Process, &l.process}, {ex.FreeResult, &l.freeResult}} {
		p, err := purego.Dlsym(h, sym.name)
		if err != nil || p == 0 {
			missing = append(missing, sym.name)
			continue
		}
		*sym.dst = p
	}
	if len(missing) > 0 {
		_ = purego.Dlclose(h)
		return nil, libraryErrorf("the library %s does not export %s (ABI v%d needs the exports %q and %q, named by entry_point and free_result in %s)%s",
			ex.fileName(runtime.GOOS), strings.Join(missing, " and "), ex.ABIVersion, ex.Process, ex.FreeResult, manifestName, mangledHint(path, missing))
	}
	return l, nil
}

// CallSlots receives Process' out parameters. It must live in the Go heap
// (not on a stack, which may move) for the duration of the call.
type CallSlots struct {
	Out    uintptr // *out: the worker's response buffer, or 0
	OutLen int32   // *out_len
}

// Call runs Process(host, in, len(in), &s.Out, &s.OutLen).
func (l *Library) Call(host uintptr, in []byte, s *CallSlots) int32 {
	s.Out, s.OutLen = 0, 0
	r1, _, _ := purego.SyscallN(l.process, host, uintptr(unsafe.Pointer(unsafe.SliceData(in))), uintptr(len(in)),
		uintptr(unsafe.Pointer(&s.Out)), uintptr(unsafe.Pointer(&s.OutLen)))
	runtime.KeepAlive(in)
	return int32(uint32(r1))
}

// FreeOut calls FreeResult(out) for a non-zero out.
func (l *Library) FreeOut(out uintptr) {
	if out != 0 {
		purego.SyscallN(l.freeResult, out)
	}
}

// Bytes is the worker's response buffer (native memory, valid until
// FreeOut): nil when there is none, an error when its length is not
// positive.
func (s *CallSlots) Bytes() ([]byte, error) {
	switch {
	case s.Out == 0:
		return nil, nil
	case s.OutLen <= 0:
		return nil, fmt.Errorf("the worker returned a response buffer with length %d", s.OutLen)
	}
	return unsafe.Slice((*byte)(cptr(s.Out)), s.OutLen), nil
}

// Close unloads the library (dlclose).
func (l *Library) Close() error {
	if l.handle == 0 {
		return nil
	}
	err := purego.Dlclose(l.handle)
	l.handle = 0
	return err
}
