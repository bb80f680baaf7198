//go:build linux || darwin || freebsd

package native

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
)

// HostMain is the main function of the native-host process
// (cmd/native-host): it loads one worker library and serves Process calls
// over the pipes on fd 3 (requests) and fd 4 (responses), one at a time,
// until fd 3 is closed. It returns the process exit code.
//
// Arguments: -library PATH [-entry NAME] [-free NAME] [-abi N]. The worker's
// identity comes from VIRTUFIN_WORKER_ID, VIRTUFIN_WORKER_GROUP and
// VIRTUFIN_WORKER_TOPIC (exact here: the process hosts one worker).
func HostMain(args []string) int {
	fs := flag.NewFlagSet("native-host", flag.ContinueOnError)
	libPath := fs.String("library", "", "path of the worker library")
	entry := fs.String("entry", DefaultEntryPoint, "name of the Process export")
	free := fs.String("free", DefaultFreeResult, "name of the FreeResult export")
	abiVersion := fs.Int("abi", CurrentABI, "worker ABI version")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	reqFile := os.NewFile(3, "requests")
	respFile := os.NewFile(4, "responses")
	if reqFile == nil || respFile == nil || !isOpen(reqFile) || !isOpen(respFile) {
		fmt.Fprintln(os.Stderr, "native-host: fd 3 and fd 4 must be the engine's pipes; this program is started by the native engine")
		return 2
	}
	// Programs the worker library starts must not inherit the protocol
	// pipes: a grandchild holding fd 4 would hide this host's exit (EOF).
	syscall.CloseOnExec(3)
	syscall.CloseOnExec(4)
	c := &childConn{r: newFrameReader(reqFile), w: newFrameWriter(respFile)}
	fail := func(invalid bool, err error) int {
		var flag byte
		if invalid {
			flag = 1
		}
		msg := err.Error()
		var ie *invalidError
		if errors.As(err, &ie) {
			msg = ie.msg
		}
		c.send(frameLoadError, []byte{flag}, []byte(msg))
		return 3
	}
	if *libPath == "" {
		return fail(false, errors.New("native-host: -library is required"))
	}
	spec, ok := lookupABI(*abiVersion)
	if !ok {
		return fail(true, checkABI(*abiVersion))
	}
	rt, err := nativeRuntime()
	if err != nil {
		return fail(false, err)
	}
	m := &Manifest{ABIVersion: *abiVersion, Library: *libPath, EntryPoint: *entry, FreeResult: *free}
	sinkID := registerSink(c)
	host := newHostBlock(rt, spec, sinkID, os.Getenv(EnvWorkerID), os.Getenv(EnvWorkerGroup), os.Getenv(EnvWorkerTopic))
	if host == nil {
		return fail(false, errors.New("native-host: out of memory"))
	}
	lib, err := openLibrary(*libPath, m)
	if err != nil {
		return fail(true, err)
	}
	if err := c.send(frameReady); err != nil {
		return 1
	}
	slots := new(callSlots)
	for {
		kind, payload, err := c.r.read()
		if err != nil {
			if errors.Is(err, io.EOF) {
				lib.close()
				return 0
			}
			fmt.Fprintln(os.Stderr, "native-host: reading a request:", err)
			return 1
		}
		if kind != frameProcess {
			fmt.Fprintf(os.Stderr, "native-host: unexpected frame %q\n", kind)
			return 1
		}
		c.setInCall(true)
		rc := lib.call(host.addr(), payload, slots)
		c.setInCall(false)
		var hasOut byte
		var out []byte
		if slots.out != 0 {
			hasOut = 1
			out, _ = outBytes(slots) // nil when out_len <= 0: the engine reports it
		}
		var n [4]byte
		binary.LittleEndian.PutUint32(n[:], uint32(slots.outLen))
		err = c.send(frameResult, le32(rc), []byte{hasOut}, n[:], out)
		lib.freeOut(slots.out)
		*slots = callSlots{}
		if err != nil {
			fmt.Fprintln(os.Stderr, "native-host: writing a result:", err)
			return 1
		}
	}
}

// childConn is the host side of the pipes; it is the hostSink of the
// loaded worker and forwards log lines and gateway calls to the engine.
type childConn struct {
	r *frameReader

	wmu sync.Mutex
	w   *frameWriter

	gmu    sync.Mutex // one gateway call at a time
	inCall bool       // guarded by gmu
}

func (c *childConn) send(kind byte, parts ...[]byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.w.write(kind, parts...)
}

func (c *childConn) setInCall(v bool) {
	c.gmu.Lock()
	c.inCall = v
	c.gmu.Unlock()
}

func (c *childConn) hostLog(level int32, msg string) {
	_ = c.send(frameLog, le32(level), []byte(msg))
}

// hostGateway sends the call to the engine and waits for its reply. Only
// valid during a Process call: the main loop is then blocked in native
// code, so reading the request pipe here does not race with it.
func (c *childConn) hostGateway(service, method string, req []byte) ([]byte, int32) {
	c.gmu.Lock()
	defer c.gmu.Unlock()
	if !c.inCall {
		return []byte("gateway_call outside of a Process call"), gatewayUnavailable
	}
	if err := c.send(frameGateway, lenPrefixed(service), lenPrefixed(method), req); err != nil {
		return []byte("native-host: " + err.Error()), gatewayError
	}
	kind, payload, err := c.r.read()
	if err != nil || kind != frameGatewayReply || len(payload) < 4 {
		fmt.Fprintln(os.Stderr, "native-host: bad gateway reply:", err)
		os.Exit(1) // the stream is out of sync: let the engine restart us
	}
	code := int32(binary.LittleEndian.Uint32(payload))
	return append([]byte(nil), payload[4:]...), code
}

// isOpen reports whether f is a pipe (the engine's): the Go runtime may
// itself have opened fd 3 and 4 (epoll, eventfd) when they were free.
func isOpen(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeNamedPipe != 0
}
