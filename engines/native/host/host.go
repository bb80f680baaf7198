//go:build linux || darwin || freebsd

package host

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/virtufin/workmanager/engines/native/internal/hostproto"
	"github.com/virtufin/workmanager/engines/native/internal/loader"
)

// Main is the main function of the native-host process (cmd/native-host):
// it loads one worker library and serves Process calls over the pipes on
// fd 3 (requests) and fd 4 (responses), one at a time, until fd 3 is
// closed. It returns the process exit code.
//
// Arguments: -library PATH [-entry NAME] [-free NAME] [-abi N]. The worker's
// identity comes from VIRTUFIN_WORKER_ID, VIRTUFIN_WORKER_GROUP and
// VIRTUFIN_WORKER_TOPIC (exact here: the process hosts one worker).
// With -await instead of -library (a spare host, started before its worker
// is known), the first frame on fd 3 says what to load and the worker's
// identity (hostproto.FrameLoad), which the host sets in its environment
// before it loads the library.
func Main(args []string) int {
	fs := flag.NewFlagSet("native-host", flag.ContinueOnError)
	libPath := fs.String("library", "", "path of the worker library")
	entry := fs.String("entry", loader.DefaultEntryPoint, "name of the Process export")
	free := fs.String("free", loader.DefaultFreeResult, "name of the FreeResult export")
	abiVersion := fs.Int("abi", loader.CurrentABI, "worker ABI version")
	await := fs.Bool("await", false, "read what to load from the first frame on fd 3 (a spare host)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	reqFile := os.NewFile(hostproto.RequestFD, "requests")
	respFile := os.NewFile(hostproto.ResponseFD, "responses")
	if reqFile == nil || respFile == nil || !isOpen(reqFile) || !isOpen(respFile) {
		fmt.Fprintln(os.Stderr, "native-host: fd 3 and fd 4 must be the engine's pipes; this program is started by the native engine")
		return 2
	}
	// Programs the worker library starts must not inherit the protocol
	// pipes: a grandchild holding fd 4 would hide this host's exit (EOF).
	syscall.CloseOnExec(hostproto.RequestFD)
	syscall.CloseOnExec(hostproto.ResponseFD)
	c := &childConn{r: hostproto.NewReader(reqFile), w: hostproto.NewWriter(respFile)}
	// fail reports a load failure; invalid: the worker's fault (bad code).
	fail := func(invalid bool, err error) int {
		var flag byte
		if invalid {
			flag = 1
		}
		c.send(hostproto.FrameLoadError, []byte{flag}, []byte(err.Error()))
		return 3
	}
	var rt *loader.Runtime
	if *await {
		// A spare: the runtime is ready before the library is known.
		var err error
		if rt, err = loader.Init(); err != nil {
			return fail(false, err)
		}
		c.r.Limit = func(byte) int { return hostproto.MaxLoadFrame }
		kind, payload, err := c.r.ReadFrame()
		if errors.Is(err, io.EOF) {
			return 0 // never used
		}
		var ld hostproto.Load
		if err == nil && kind != hostproto.FrameLoad {
			err = fmt.Errorf("frame %q, want a load frame", kind)
		}
		if err == nil {
			err = json.Unmarshal(payload, &ld)
		}
		if err != nil {
			return fail(false, fmt.Errorf("native-host: reading what to load: %w", err))
		}
		c.r.Limit = nil
		*libPath, *entry, *free, *abiVersion = ld.Library, ld.Entry, ld.Free, ld.ABIVersion
		for k, v := range map[string]string{hostproto.EnvWorkerID: ld.WorkerID, hostproto.EnvWorkerGroup: ld.Group, hostproto.EnvWorkerTopic: ld.Topic} {
			os.Setenv(k, v)
		}
	}
	if *libPath == "" {
		return fail(false, errors.New("native-host: -library is required"))
	}
	spec, ok := loader.LookupABI(*abiVersion)
	if !ok {
		return fail(true, loader.CheckABI(*abiVersion))
	}
	if rt == nil {
		var err error
		if rt, err = loader.Init(); err != nil {
			return fail(false, err)
		}
	}
	sinkID := loader.RegisterSink(c)
	host := rt.NewHost(spec, sinkID, os.Getenv(hostproto.EnvWorkerID), os.Getenv(hostproto.EnvWorkerGroup), os.Getenv(hostproto.EnvWorkerTopic))
	if host == nil {
		return fail(false, errors.New("native-host: out of memory"))
	}
	lib, err := loader.Open(*libPath, loader.Exports{File: filepath.Base(*libPath), Process: *entry, FreeResult: *free, ABIVersion: *abiVersion})
	if err != nil {
		return fail(true, err)
	}
	if err := c.send(hostproto.FrameReady); err != nil {
		return 1
	}
	slots := new(loader.CallSlots)
	for {
		kind, payload, err := c.r.ReadFrame()
		if err != nil {
			if errors.Is(err, io.EOF) {
				lib.Close()
				return 0
			}
			fmt.Fprintln(os.Stderr, "native-host: reading a request:", err)
			return 1
		}
		if kind != hostproto.FrameProcess {
			fmt.Fprintf(os.Stderr, "native-host: unexpected frame %q\n", kind)
			return 1
		}
		c.setInCall(true)
		rc := lib.Call(host.Addr(), payload, slots)
		c.setInCall(false)
		var hasOut byte
		var out []byte
		if slots.Out != 0 {
			hasOut = 1
			out, _ = slots.Bytes() // nil when out_len <= 0: the engine reports it
		}
		err = c.send(hostproto.FrameResult, hostproto.Int32(rc), []byte{hasOut}, hostproto.Int32(slots.OutLen), out)
		lib.FreeOut(slots.Out)
		*slots = loader.CallSlots{}
		if err != nil {
			fmt.Fprintln(os.Stderr, "native-host: writing a result:", err)
			return 1
		}
	}
}

// childConn is the host side of the pipes; it is the loader.Sink of the
// loaded worker and forwards log lines and gateway calls to the engine.
type childConn struct {
	r *hostproto.Reader

	wmu sync.Mutex
	w   *hostproto.Writer

	gmu    sync.Mutex // one gateway call at a time
	inCall bool       // guarded by gmu
}

func (c *childConn) send(kind byte, parts ...[]byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.w.WriteFrame(kind, parts...)
}

func (c *childConn) setInCall(v bool) {
	c.gmu.Lock()
	c.inCall = v
	c.gmu.Unlock()
}

// HostLog implements loader.Sink.
func (c *childConn) HostLog(level int32, msg string) {
	_ = c.send(hostproto.FrameLog, hostproto.Int32(level), []byte(msg))
}

// HostGateway implements loader.Sink: it sends the call to the engine and
// waits for its reply. Only valid during a Process call: the main loop is
// then blocked in native code, so reading the request pipe here does not
// race with it.
func (c *childConn) HostGateway(service, method string, req []byte) ([]byte, int32) {
	c.gmu.Lock()
	defer c.gmu.Unlock()
	if !c.inCall {
		return []byte("gateway_call outside of a Process call"), loader.GatewayUnavailable
	}
	if err := c.send(hostproto.FrameGatewayCall, hostproto.LenPrefixed(service), hostproto.LenPrefixed(method), req); err != nil {
		return []byte("native-host: " + err.Error()), loader.GatewayError
	}
	kind, payload, err := c.r.ReadFrame()
	code, resp, ok := hostproto.ParseInt32Prefixed(payload)
	if err != nil || kind != hostproto.FrameGatewayReply || !ok {
		fmt.Fprintln(os.Stderr, "native-host: bad gateway reply:", err)
		os.Exit(1) // the stream is out of sync: let the engine restart us
	}
	return append([]byte(nil), resp...), code
}

// isOpen reports whether f is a pipe (the engine's): the Go runtime may
// itself have opened fd 3 and 4 (epoll, eventfd) when they were free.
func isOpen(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeNamedPipe != 0
}
