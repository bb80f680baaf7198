//go:build linux || darwin || freebsd

package native

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
)

// holdingGateway records each call with its fence and holds the calls whose
// method is hold until release is closed, saying on arrived when one came.
type holdingGateway struct {
	hold    string
	arrived chan string
	release chan struct{}

	mu    sync.Mutex
	calls map[string][]*engines.Fence // by method
}

func (g *holdingGateway) Call(ctx context.Context, service, method string, req []byte) ([]byte, error) {
	g.mu.Lock()
	g.calls[method] = append(g.calls[method], engines.FenceFrom(ctx))
	g.mu.Unlock()
	g.arrived <- method
	if method == g.hold {
		select {
		case <-g.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return []byte(`{"ok":true}`), nil
}

func (g *holdingGateway) fences(method string) []*engines.Fence {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*engines.Fence(nil), g.calls[method]...)
}

// TestAbandonedCallDoesNotActUnderTheNextCallsFence is issue 43's item 9:
// the in-process engine kept the fence of the worker's latest call, so a
// call abandoned at its timeout that made a gateway call later, while the
// next call ran, passed the gateway's Check with the next call's token.
// Now the fence belongs to the call, and it ends when the call is
// abandoned: its gateway calls no longer act under any lock.
func TestAbandonedCallDoesNotActUnderTheNextCallsFence(t *testing.T) {
	gw := &holdingGateway{hold: "b/call", arrived: make(chan string, 8), release: make(chan struct{}), calls: map[string][]*engines.Fence{}}
	e := newTestEngine(t, Config{Gateway: gw})
	spec := testSpec
	spec.Timeout = 30 * time.Second
	inst := load(t, e, spec, packageOf(t, flagsEcho, nil))
	in := inst.(*inprocInstance)
	defer func() {
		select {
		case <-gw.release:
		default:
			close(gw.release)
		}
	}()

	ok := func(context.Context) error { return nil }
	fenceA := &engines.Fence{Group: "g", Token: 1, Check: ok}
	fenceB := &engines.Fence{Group: "g", Token: 2, Check: ok}
	fileA := filepath.Join(t.TempDir(), "a")

	// Call A waits in native code for fileA, past its deadline: abandoned.
	evA := typed("test.gateway", map[string]any{"q": "a"})
	evA.SetExtension("gwmethod", "a/call")
	evA.SetExtension("gwwaitfile", fileA)
	ctxA, cancelA := context.WithTimeout(engines.WithFence(context.Background(), fenceA), 100*time.Millisecond)
	defer cancelA()
	if _, err := inst.Process(ctxA, evA); err == nil {
		t.Fatal("call A returned before its file existed")
	}
	if in.abandoned.Load() != 1 {
		t.Fatalf("%d abandoned calls, want call A", in.abandoned.Load())
	}

	// Call B runs under the next token and is held in its gateway call.
	evB := typed("test.gateway", map[string]any{"q": "b"})
	evB.SetExtension("gwmethod", "b/call")
	ctxB, cancelB := context.WithTimeout(engines.WithFence(context.Background(), fenceB), 30*time.Second)
	defer cancelB()
	doneB := make(chan error, 1)
	go func() {
		_, err := inst.Process(ctxB, evB)
		doneB <- err
	}()
	if m := <-gw.arrived; m != "b/call" {
		t.Fatalf("gateway call %q, want call B's", m)
	}

	// Now the abandoned call A makes its gateway call, and returns.
	if err := os.WriteFile(fileA, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); in.abandoned.Load() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("call A did not return from native code")
		}
	}
	for _, f := range gw.fences("a/call") {
		if f == nil {
			t.Fatal("the abandoned call's gateway call went out without a fence")
		}
		if f == fenceB || f.Token == fenceB.Token {
			t.Fatalf("the abandoned call's gateway call carried the next call's fence (token %d)", f.Token)
		}
		if err := f.Check(context.Background()); err == nil {
			t.Fatalf("the abandoned call's gateway call carried a fence that still passes Check (token %d)", f.Token)
		}
	}

	close(gw.release)
	if err := <-doneB; err != nil {
		t.Fatalf("call B: %v", err)
	}
	if fs := gw.fences("b/call"); len(fs) != 1 || fs[0] != fenceB {
		t.Fatalf("call B's gateway call carried %v, want its own fence", fs)
	}
	// The slot call A held serves the next calls under their own fence.
	ev := typed("test.gateway", map[string]any{"q": "c"})
	ev.SetExtension("gwmethod", "c/call")
	ctxC, cancelC := context.WithTimeout(engines.WithFence(context.Background(), fenceA), 30*time.Second)
	defer cancelC()
	for range cap(in.slots) + 1 {
		if _, err := inst.Process(ctxC, ev); err != nil {
			t.Fatalf("a later call: %v", err)
		}
		<-gw.arrived
	}
	for _, f := range gw.fences("c/call") {
		if f != fenceA {
			t.Fatalf("a later call's gateway call carried %+v, want its own fence", f)
		}
	}
}
