// Package nodetest builds a real node for tests, without servers: the memory
// state store, a test engine, and a real dispatcher on a broker that never
// delivers. The node's own tests and the activities' tests use it.
package nodetest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/delivery"
	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/dispatch/dispatchtest"
	"github.com/virtufin/workmanager/internal/grouplock"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/node"
	"github.com/virtufin/workmanager/internal/publish/publishtest"
	"github.com/virtufin/workmanager/internal/state"
)

// MIMEType is served by the test engine.
const MIMEType = "text/x-test"

// BadCode is the code the test engine refuses.
const BadCode = "bad"

// SlowCode is code whose Load waits until Engine.Release (or ctx ends).
const SlowCode = "slow"

// Engine accepts any code but BadCode and counts loaded instances.
type Engine struct {
	mu       sync.Mutex
	loads    int
	parked   int // loads with Spec.Parked
	attempts int
	inFlight int // Load calls not returned yet
	maxIn    int // the most there were at once
	slow     chan struct{}
	slowOnce sync.Once
	checks   []engines.Spec // the specs Check was given
}

// Checks returns the specs Check was given, in order.
func (e *Engine) Checks() []engines.Spec {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]engines.Spec(nil), e.checks...)
}

// Attempts counts Load calls, failed ones included.
func (e *Engine) Attempts() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.attempts
}

func (e *Engine) gate() chan struct{} {
	e.slowOnce.Do(func() { e.slow = make(chan struct{}) })
	return e.slow
}

// Release lets every Load of SlowCode finish.
func (e *Engine) Release() { close(e.gate()) }

// MaxInFlight is the most Load calls that were running at once.
func (e *Engine) MaxInFlight() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.maxIn
}

// Loads counts the instances loaded so far.
func (e *Engine) Loads() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.loads
}

// ParkedLoads counts the successful Loads asked for with Spec.Parked.
func (e *Engine) ParkedLoads() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.parked
}

// Info implements engines.Engine.
func (e *Engine) Info() engines.Info {
	// In-process, like a native engine in its default mode: its workers
	// can be quarantined (internal/node/quarantine.go).
	return engines.Info{Name: "test", MIMETypes: []string{MIMEType}, Capabilities: engines.Capabilities{InProcess: true}}
}

// Check implements engines.Engine.
func (e *Engine) Check(_ context.Context, s engines.Spec, code []byte) error {
	e.mu.Lock()
	e.checks = append(e.checks, s)
	e.mu.Unlock()
	return valid(code)
}

// valid refuses BadCode as invalid code.
func valid(code []byte) error {
	if string(code) == BadCode {
		return fmt.Errorf("%w: line 1: nothing good here", engines.ErrInvalidCode)
	}
	return nil
}

// Load implements engines.Engine.
func (e *Engine) Load(ctx context.Context, s engines.Spec, code []byte) (engines.Instance, error) {
	e.mu.Lock()
	e.attempts++
	e.inFlight++
	e.maxIn = max(e.maxIn, e.inFlight)
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.inFlight--
		e.mu.Unlock()
	}()
	if string(code) == SlowCode {
		select {
		case <-e.gate():
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if err := valid(code); err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.loads++
	if s.Parked {
		e.parked++
	}
	e.mu.Unlock()
	return instance{}, nil
}

type instance struct{}

func (instance) Process(context.Context, *event.Event) ([]event.Event, error) { return nil, nil }
func (instance) Close(context.Context) error                                  { return nil }

// Fixture is a node and what it is made of.
type Fixture struct {
	Node       *node.Node
	Store      *state.MemoryStore
	Catalog    *catalog.Catalog
	Dispatcher *dispatch.Dispatcher
	Broker     *dispatchtest.Broker // the dispatcher's topics
	Engine     *Engine
	Published  *publishtest.Recorder
	Events     *lifecycleevents.Emitter
}

// New builds a Fixture whose node is shut down when the test ends; extra
// engines are registered beside the test engine (a benchmark's real one).
func New(t testing.TB, extra ...engines.Engine) *Fixture {
	t.Helper()
	return NewOnStore(t, nil, extra...)
}

// NewOnStore is New whose catalog (and so the node) goes through
// wrap(Store), a store that injects faults; Store stays the memory store
// underneath, to read what was written.
func NewOnStore(t testing.TB, wrap func(state.Store) state.Store, extra ...engines.Engine) *Fixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f := &Fixture{Store: state.NewMemoryStore(), Engine: &Engine{}, Published: &publishtest.Recorder{}, Broker: dispatchtest.NewBroker()}
	var st state.Store = f.Store
	if wrap != nil {
		st = wrap(st)
	}
	f.Catalog = catalog.New(st)
	reg := engines.NewRegistry()
	for _, e := range append([]engines.Engine{f.Engine}, extra...) {
		if err := reg.Register(e); err != nil {
			t.Fatal(err)
		}
	}
	f.Events = lifecycleevents.NewEmitter(f.Published)
	f.Dispatcher = dispatch.New(ctx, log, dispatch.Deps{Sub: f.Broker, Pub: f.Published, Events: f.Events,
		Records: delivery.NewStore(f.Store, time.Hour), Locks: grouplock.New(f.Store, grouplock.Config{}),
		DeadLetters: deadletter.NewStore(f.Store, time.Hour)}, dispatch.Config{PubSub: "pubsub", NodeID: "test", MaxConcurrency: 1})
	f.Node = node.New(log, f.Catalog, reg, f.Dispatcher, time.Second)
	t.Cleanup(func() { f.Node.Shutdown(context.Background()) })
	return f
}

// Worker is a worker record of the test engine, id w1 on topic "in".
func Worker(status catalog.Status, sha string) catalog.Worker {
	return catalog.Worker{ID: "w1", MIMEType: MIMEType, Topic: "in", Group: "g", Status: status, CodeVersion: 1, CodeSHA256: sha}
}
