package wasm

import (
	"bytes"
	"context"
	"log/slog"
	"sync"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/virtufin/workmanager/engines"
)

// The host functions of the "workmanager" import module. Each finds the
// call it serves by the context wazero hands it (the call's, carrying its
// slot, its deadline and its group lock's fence).

// maxGatewayName bounds a gateway call's service and method.
const maxGatewayName = 4 << 10

func (e *Engine) instantiateHost(ctx context.Context, rt wazero.Runtime) error {
	b := rt.NewHostModuleBuilder(HostModule)
	fns := map[string]api.GoModuleFunc{
		"log":              hostLog,
		"gateway_call":     e.hostGatewayCall,
		"gateway_response": hostGatewayResponse,
	}
	for name, fn := range fns {
		sig := hostFunctions[name]
		b = b.NewFunctionBuilder().WithGoModuleFunction(fn, sig.params, sig.results).WithName(name).Export(name)
	}
	_, err := b.Instantiate(ctx)
	return err
}

// slogLevel maps the ABI's log levels (0 trace .. 4 error, those of the
// native ABI) to slog levels.
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

// hostLog is log(level, ptr, len): one line to the worker's logger (at
// most maxLogLine bytes of it).
func hostLog(ctx context.Context, m api.Module, st []uint64) {
	s := slotFrom(ctx)
	if s == nil {
		return
	}
	level, ptr, n := int32(uint32(st[0])), uint32(st[1]), uint32(st[2])
	n = min(n, maxLogLine)
	msg, ok := m.Memory().Read(ptr, n)
	if !ok {
		s.in.wlog.Warn("the worker's log message is outside its memory", "ptr", ptr, "len", n)
		return
	}
	s.in.wlog.Log(ctx, slogLevel(level), string(msg))
}

// hostGatewayCall is gateway_call(service, service_len, method,
// method_len, request, request_len) -> i64: the code (Gateway*) in the
// high 32 bits, the length of the response (or error text) in the low 32
// bits; the module copies it with gateway_response. The call runs under
// the event's context: its deadline, and its group lock's fence.
func (e *Engine) hostGatewayCall(ctx context.Context, m api.Module, st []uint64) {
	s := slotFrom(ctx)
	if s == nil {
		st[0] = uint64(GatewayBadArgs) << 32
		return
	}
	reply := func(code int32, resp []byte) {
		s.gwResp = resp
		st[0] = uint64(uint32(code))<<32 | uint64(uint32(len(resp)))
	}
	mem := m.Memory()
	sp, sn, mp, mn, rp, rn := uint32(st[0]), uint32(st[1]), uint32(st[2]), uint32(st[3]), uint32(st[4]), uint32(st[5])
	if sn > maxGatewayName || mn > maxGatewayName || int64(rn) > int64(e.cfg.MaxReplyBytes) {
		reply(GatewayBadArgs, []byte("gateway_call: service or method over 4 KiB, or a request over the node's reply limit"))
		return
	}
	svc, ok1 := mem.Read(sp, sn)
	method, ok2 := mem.Read(mp, mn)
	req, ok3 := mem.Read(rp, rn)
	if !ok1 || !ok2 || !ok3 || sn == 0 || mn == 0 {
		reply(GatewayBadArgs, []byte("gateway_call: empty service or method, or an argument outside the module's memory"))
		return
	}
	if e.cfg.Gateway == nil {
		reply(GatewayUnavailable, []byte("no gateway is configured on this node"))
		return
	}
	service, meth := string(svc), string(method)
	if err := engines.CheckGatewayTarget(s.in.spec.GatewayTargets, service, meth); err != nil {
		reply(GatewayError, []byte(err.Error()))
		return
	}
	resp, err := e.cfg.Gateway.Call(engines.WithGatewayTargets(ctx, s.in.spec.GatewayTargets), service, meth, bytes.Clone(req))
	if err != nil {
		msg := err.Error()
		if msg == "" {
			msg = "gateway call failed"
		}
		reply(GatewayError, []byte(msg))
		return
	}
	reply(GatewayOK, resp)
}

// hostGatewayResponse is gateway_response(ptr, cap) -> i32: copies up to
// cap bytes of the last gateway call's response to ptr and returns how
// many (-1: outside the module's memory); the response is then gone.
func hostGatewayResponse(ctx context.Context, m api.Module, st []uint64) {
	s := slotFrom(ctx)
	if s == nil {
		st[0] = 0
		return
	}
	ptr, n := uint32(st[0]), uint32(st[1])
	n = min(n, uint32(len(s.gwResp)))
	if !m.Memory().Write(ptr, s.gwResp[:n]) {
		st[0] = uint64(uint32(0xffffffff))
		return
	}
	s.gwResp = nil
	st[0] = uint64(n)
}

// logWriter turns what a module writes to stdout or stderr (WASI) into
// log lines of the worker, each at most maxLogLine bytes, and keeps the
// end of what it wrote since resetTail (for a trap's message: a Go
// module's panic goes there).
type logWriter struct {
	log    *slog.Logger
	level  slog.Level
	stream string

	mu      sync.Mutex
	line    []byte
	tailBuf []byte
}

const maxTail = 2 << 10

func newLogWriter(log *slog.Logger, level slog.Level, stream string) *logWriter {
	return &logWriter{log: log, level: level, stream: stream}
}

func (w *logWriter) Write(p []byte) (int, error) {
	n := len(p)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.tailBuf = append(w.tailBuf, p...)
	if len(w.tailBuf) > 2*maxTail {
		w.tailBuf = append(w.tailBuf[:0], w.tailBuf[len(w.tailBuf)-maxTail:]...)
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			w.line = append(w.line, p[:min(len(p), maxLogLine-len(w.line))]...)
			if len(w.line) >= maxLogLine {
				w.flush()
			}
			break
		}
		w.line = append(w.line, p[:min(i, maxLogLine-len(w.line))]...)
		w.flush()
		p = p[i+1:]
	}
	return n, nil
}

func (w *logWriter) flush() {
	w.log.Log(context.Background(), w.level, string(w.line), "stream", w.stream)
	w.line = w.line[:0]
}

// resetTail forgets what was written so far (a call starts).
func (w *logWriter) resetTail() {
	w.mu.Lock()
	w.tailBuf = w.tailBuf[:0]
	w.mu.Unlock()
}

// tail is the end of what was written since resetTail, trimmed.
func (w *logWriter) tail() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	t := w.tailBuf
	if len(t) > maxTail {
		t = t[len(t)-maxTail:]
	}
	return string(bytes.TrimSpace(t))
}
