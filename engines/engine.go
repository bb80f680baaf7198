// Package engines owns the contract between WorkManager and the runtimes that
// execute worker code (Python, native libraries, .NET, ...), and the registry
// that maps a worker's MIME type to the engine that runs it.
//
// An engine is a driver in the Nomad sense: one small interface (Engine and
// Instance), capabilities described as data (Capabilities), optional features as
// small extra interfaces, and every built-in registered in one place
// (engines/builtin). Every engine must pass the conformance suite in
// engines/enginetest.
package engines

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
)

// Engine loads worker code of one or more MIME types.
type Engine interface {
	// Info describes the engine; it must be cheap and constant.
	Info() Info
	// Check verifies that code would load (compiles, exports what the ABI
	// requires) without keeping anything running. It returns an error wrapping
	// ErrInvalidCode with a message that says what is wrong when the code is bad.
	Check(ctx context.Context, spec Spec, code []byte) error
	// Load starts an Instance that serves spec with code. Bad code gives an
	// error wrapping ErrInvalidCode.
	Load(ctx context.Context, spec Spec, code []byte) (Instance, error)
}

// Instance is one loaded version of one worker's code.
//
// Process must be safe for concurrent use; an engine that cannot run calls in
// parallel serializes them itself (and says so in Capabilities). Hot reload is
// done by the caller: it loads a new Instance, routes new messages to it and
// closes the old one once its in-flight calls returned.
type Instance interface {
	// Process runs the worker on one input event and returns its outputs (zero
	// or more). A worker failure returns an error wrapping ErrWorkerFailed; a
	// call that exceeded its deadline returns one wrapping ErrTimeout. The
	// input is only valid during the call: the caller reuses it afterwards.
	Process(ctx context.Context, in *event.Event) ([]event.Event, error)
	// Close releases everything the instance holds (processes, handles,
	// temporary files). It waits for in-flight calls at most until ctx ends.
	Close(ctx context.Context) error
}

// Info describes an engine as data.
type Info struct {
	// Name is a short identifier used in logs and metrics ("python").
	Name string
	// MIMETypes are the worker MIME types this engine serves.
	MIMETypes []string
	// Capabilities says what the engine can and cannot do.
	Capabilities Capabilities
}

// Capabilities are the properties of an engine that callers may rely on.
type Capabilities struct {
	// InProcess is true when worker code runs inside the WorkManager process (a
	// crash in it ends the node).
	InProcess bool
	// Interruptible is true when a call that exceeds its deadline is really
	// stopped (false: the engine reports ErrTimeout but the call keeps running).
	Interruptible bool
	// ParallelCalls is the number of calls one Instance runs at the same time
	// (0 means unbounded: the caller's bound applies).
	ParallelCalls int
}

// Spec is what an engine knows about the worker it loads.
type Spec struct {
	WorkerID string
	MIMEType string
	Topic    string
	Group    string
	// Tenant owns the worker ("" when the caller names none). Engines
	// that keep a process for the next compile of code (the .NET
	// engine's kept compilers) keep it for one tenant's code only, and
	// engines that cache prepared code (the .NET engine's compiled
	// sources and unpacked packages) keep a tenant's entries its own.
	Tenant string
	// Timeout bounds one Process call; 0 means the engine's default.
	Timeout time.Duration
	// Logger receives the worker's own log output.
	Logger *slog.Logger
	// GatewayTargets are the "service/method" patterns the worker's gateway
	// calls may reach (CheckGatewayTarget); empty: any.
	GatewayTargets []string
	// MaxConcurrency bounds the calls an engine that overlaps them in one
	// process (Python's async def workers) runs at once; 0: the engine's
	// default. MaxProcesses bounds the processes an engine starts for the
	// worker on demand; 0: the engine's default.
	MaxConcurrency int
	MaxProcesses   int
	// Parked asks Load for an Instance with no process started when the
	// engine parks idle workers (PYTHON_PARK_AFTER, DOTNET_PARK_AFTER):
	// its first event starts one, as after parking. A node sets it when it
	// attaches a worker again: a record unchanged since the node started,
	// reached by its reconcile (at start, after a lapse) or recovery's
	// Activate; they wait parked instead of all starting at once. The code was checked when it was
	// loaded in; a failure to start shows on the first event. Engines that
	// park nothing (or with parking off) start their processes as usual.
	Parked bool
	// LoadsElsewhere tells Check that the Load which follows will run on
	// other nodes (the node does not serve the worker's topic): the
	// process that checked the code is not kept for a Load here
	// (procpool.Parking), it exits at once.
	LoadsElsewhere bool
}

// WithDefaults returns the spec with a zero Timeout and a nil Logger
// replaced by an engine's defaults. Engines call it once where a spec comes
// in (Check, Load) and use the fields directly after.
func (s Spec) WithDefaults(timeout time.Duration, logger *slog.Logger) Spec {
	if s.Timeout <= 0 {
		s.Timeout = timeout
	}
	if s.Logger == nil {
		s.Logger = logger
	}
	return s
}

// OutputError says what is wrong with output i of a call (i < 0: with the
// outputs as a whole), for the engines' worker-failure errors.
func OutputError(i int, err error) string {
	if i < 0 {
		return "decoding the outputs: " + err.Error()
	}
	return fmt.Sprintf("output %d: %v", i, err)
}

// Gateway lets worker code call backend services. The node's implementation
// uses Dapr service invocation; service is a Dapr app id or HTTPEndpoint
// name, method the path, request and response opaque bytes (JSON by
// convention).
//
// A call made while the worker holds its group's lock carries the lock's
// Fence in ctx (FenceFrom): the Gateway checks it before calling and sends
// the token along, so that a stale holder reaches no backend. Engines pass
// the ctx of the Process call, or that call's Fence, to Call (never another
// call's: the in-process native engine tells calls apart by their host
// struct, and refuses the host calls of a call it abandoned at its timeout).
type Gateway interface {
	Call(ctx context.Context, service, method string, request []byte) ([]byte, error)
}

// Fence is the group lock a call runs under: its group, its fencing token
// (increasing with every acquisition of the group) and Check, which fails
// (wrapping the lock's stale error) once the lock is no longer held.
type Fence struct {
	Group string
	Token int64
	Check func(ctx context.Context) error
}

type fenceKey struct{}

// WithFence returns ctx carrying f.
func WithFence(ctx context.Context, f *Fence) context.Context {
	return context.WithValue(ctx, fenceKey{}, f)
}

// FenceFrom returns the Fence ctx carries, or nil outside a group lock.
func FenceFrom(ctx context.Context) *Fence {
	f, _ := ctx.Value(fenceKey{}).(*Fence)
	return f
}

// Errors engines wrap so that callers can classify failures without knowing
// the engine.
var (
	// ErrInvalidCode: the code does not compile or load. Not retryable.
	ErrInvalidCode = errors.New("invalid worker code")
	// ErrWorkerFailed: the worker raised an error while processing a message.
	ErrWorkerFailed = errors.New("worker failed")
	// ErrInvalidOutput marks a worker failure (it also matches
	// ErrWorkerFailed) in which the call returned but its outputs cannot be
	// published as they are: an output without "type", undecodable JSON,
	// a value that cannot be encoded. Running the same input again returns
	// the same outputs, so the dispatcher dead-letters it at once (reason
	// output_invalid) instead of retrying.
	ErrInvalidOutput = errors.New("invalid output")
	// ErrTimeout: the worker did not answer within its timeout.
	ErrTimeout = errors.New("worker timed out")
	// ErrClosed: the instance was closed (the call may have been cut off by
	// a stop or a reload); the message should be redelivered.
	ErrClosed = errors.New("worker instance closed")
	// ErrUnknownMIMEType: no engine is registered for the MIME type.
	ErrUnknownMIMEType = errors.New("unknown MIME type")
)

// Traceback is where a worker's failure happened, when its engine knows:
// the Python traceback (the worker's frames, file "<worker>" and line, then
// the exception), the .NET exception with its stack, a native worker's error
// text; "" for other errors. The engines bound it (16 KiB, its end kept);
// it is the worker's text, not yet redacted for leaving the node.
func Traceback(err error) string {
	var t interface{ WorkerTraceback() string }
	if errors.As(err, &t) {
		return t.WorkerTraceback()
	}
	return ""
}

// ErrorAnswer is a worker's own answer that it could not handle an event
// (the native ABI's error_message with return code 0): an answer, not a
// crash. The hot path announces it (a worker.error lifecycle event, error
// type "error_response"), publishes Outputs — the error response the worker
// gave — or, when it gave none, a default error response of type
// "<input type>.error" (data {"error", "input_id", "input_type"}, as the
// DevKits' Error builds), and the event is done: no retry, no dead letter.
// Crashes, timeouts and transport failures stay failed attempts. It matches
// ErrWorkerFailed for callers that know no better.
type ErrorAnswer struct {
	Message string
	Outputs []event.Event
}

func (e *ErrorAnswer) Error() string {
	return ErrWorkerFailed.Error() + ": the worker answered with an error: " + e.Message
}

func (e *ErrorAnswer) Unwrap() error { return ErrWorkerFailed }

// WorkerTraceback is the worker's error text (Traceback).
func (e *ErrorAnswer) WorkerTraceback() string { return e.Message }

// Registry maps MIME types to engines. The zero value is not usable; use
// NewRegistry.
type Registry struct {
	mu      sync.RWMutex
	engines map[string]Engine
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{engines: map[string]Engine{}} }

// Register adds an engine for every MIME type in its Info. Registering a MIME
// type twice is a programming error and returns an error.
func (r *Registry) Register(e Engine) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	info := e.Info()
	if len(info.MIMETypes) == 0 {
		return fmt.Errorf("engine %q declares no MIME type", info.Name)
	}
	for _, m := range info.MIMETypes {
		if old, ok := r.engines[m]; ok {
			return fmt.Errorf("MIME type %q is already served by engine %q", m, old.Info().Name)
		}
	}
	for _, m := range info.MIMETypes {
		r.engines[m] = e
	}
	return nil
}

// Lookup returns the engine for a MIME type, or an error wrapping
// ErrUnknownMIMEType that lists the supported ones.
func (r *Registry) Lookup(mimeType string) (Engine, error) {
	r.mu.RLock()
	e, ok := r.engines[mimeType]
	r.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w %q (supported: %v)", ErrUnknownMIMEType, mimeType, r.MIMETypes())
	}
	return e, nil
}

// MIMETypesOf lists the MIME types served by the engines named in names
// (Info.Name), sorted: what a node whose runtime checks passed for those
// engines can run.
func (r *Registry) MIMETypesOf(names []string) []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []string
	for m, e := range r.engines {
		if slices.Contains(names, e.Info().Name) {
			out = append(out, m)
		}
	}
	sort.Strings(out)
	return out
}

// MIMETypes lists the registered MIME types, sorted.
func (r *Registry) MIMETypes() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.engines))
	for m := range r.engines {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// ContextError describes a call that ended because ctx did, for every engine
// alike: a passed deadline (or none left) is ErrTimeout, which the hot path
// reports as the worker's timeout; a cancellation (a stop, a reload, the
// node shutting down) is not the worker's fault. what says where the call
// was ("waiting for a free worker process", "during the call …").
func ContextError(ctx context.Context, engine, what string) error {
	err := ctx.Err()
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		if err == nil {
			err = context.DeadlineExceeded
		}
		return fmt.Errorf("%w: %s: %w", ErrTimeout, what, err)
	}
	return fmt.Errorf("%s engine: %s: %w", engine, what, err)
}

// Warmer is an optional feature of an engine whose runtime takes a while
// to prepare (find a toolchain, compile a host): Warm does that ahead of
// the first Check or Load, bounded by ctx, and describes the runtime it
// prepared for /health. The error says what is missing.
type Warmer interface {
	Warm(ctx context.Context) (string, error)
}

// Batcher is an optional feature of an Instance that sends the calls
// waiting for its processes to them together, in one round trip each way
// (the Python engine's batches). Such an Instance gets cheaper per call the
// more calls it holds at once, up to CallsToFill: enough to keep every
// process busy with one full batch while the next one fills. The
// dispatcher lets up to that many of the worker's messages into the
// Instance at once when it is more than its default (WORKER_MAX_CONCURRENCY).
// 0: no batching.
//
// The calls beyond the running ones wait inside the Instance, so a Batcher
// honours WithGiveBack: a stopping worker gets its waiting calls back, as
// it gets back the messages still in its queue, instead of waiting for
// them to run.
type Batcher interface {
	CallsToFill() int
}

// Concurrent is an optional feature of an Instance that runs many calls at
// once (the Python engine's async workers and extra processes): MaxCalls
// is how many of the worker's messages the dispatcher may hand it at the
// same time (calls beyond what it runs wait inside it and honour
// WithGiveBack, as a Batcher's).
type Concurrent interface {
	MaxCalls() int
}

// InProcessCalls is what an in-process engine's instance (native in
// process, WebAssembly) answers MaxCalls by default: its calls take
// microseconds, and the rest of a message's time — reading its delivery
// record, publishing the outputs, writing the record — is I/O that
// overlaps with the other messages', so the dispatcher's default (8 at
// once) would cap a worker at 8 messages per round trip time. Python's
// batched workers get as many (2 batches of 16).
const InProcessCalls = 32

// Lender is an optional feature of an Instance whose outputs can point
// into memory the worker owns instead of being copied out of it (the
// native engine's in-process response buffer): ProcessLent is Process,
// except that the outputs' data (DataEncoded) and their event contexts —
// those it returns and those of an ErrorAnswer — stay valid only until
// the Loan is returned, and the caller must return it exactly once, after
// its last use of them (a nil Loan: nothing to return). Attribute strings
// are Go strings a caller may keep. An Instance does not finish closing
// while a Loan of it is out.
type Lender interface {
	ProcessLent(ctx context.Context, in *event.Event) ([]event.Event, Loan, error)
}

// Loan is what a Lender's outputs point into; Return gives it back.
type Loan interface {
	Return()
}

// ErrGivenBack is wrapped by Process for a call that was still waiting for
// a process when its ctx's give-back channel closed (WithGiveBack): the
// worker never saw the event.
var ErrGivenBack = errors.New("given back before it started")

type giveBackKey struct{}

// WithGiveBack returns ctx carrying ch: once ch is closed, a Batcher gives
// back the calls made with ctx that have not started (ErrGivenBack); calls
// already running finish.
func WithGiveBack(ctx context.Context, ch <-chan struct{}) context.Context {
	return context.WithValue(ctx, giveBackKey{}, ch)
}

// GiveBack is ctx's give-back channel (nil, which never closes, when none).
func GiveBack(ctx context.Context) <-chan struct{} {
	ch, _ := ctx.Value(giveBackKey{}).(<-chan struct{})
	return ch
}

// Closer is an optional feature of an engine that holds processes of its
// own outside any Instance (runners a Check keeps for the following Load):
// Close ends them. The node calls it once, at shutdown, after closing its
// Instances.
type Closer interface {
	Close() error
}

// ErrGatewayDenied is wrapped by a gateway call outside the worker's
// allowed targets.
var ErrGatewayDenied = errors.New("not allowed by the worker's policy")

type gatewayTargetsKey struct{}

// WithGatewayTargets returns ctx carrying the calling worker's
// Spec.GatewayTargets, for the Gateway: what only the worker's policy may
// allow (a query in the method) is decided there. The engines set it on
// every gateway call.
func WithGatewayTargets(ctx context.Context, allowed []string) context.Context {
	return context.WithValue(ctx, gatewayTargetsKey{}, allowed)
}

// GatewayTargetsFrom returns the targets WithGatewayTargets put on ctx.
func GatewayTargetsFrom(ctx context.Context) []string {
	allowed, _ := ctx.Value(gatewayTargetsKey{}).([]string)
	return allowed
}

// CheckGatewayTarget says whether a worker whose Spec.GatewayTargets is
// allowed may call service/method: allowed holds path.Match patterns of
// "service/method"; empty allows any target.
func CheckGatewayTarget(allowed []string, service, method string) error {
	if len(allowed) == 0 {
		return nil
	}
	target := service + "/" + method
	for _, p := range allowed {
		if ok, _ := path.Match(p, target); ok {
			return nil
		}
	}
	return fmt.Errorf("gateway target %q is not in allowed_gateway_targets %q: %w", target, allowed, ErrGatewayDenied)
}
