package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/dispatch"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// The shared stack. A full stack (Redis, Temporal, daprd, node, API) takes
// seconds to start; tests that neither restart nor break their stack nor
// change its settings run on one stack per package run instead of one
// each. They run one after another (subtests of TestSharedStack), each on
// its own topics (topicName), and what one leaves behind is removed when it
// ends (sharedEnv), so each starts from an empty catalog.
var sharedStack struct {
	once sync.Once
	tb   *packageTB
	env  *stackEnv
	err  error
}

// sharedEnv returns t's handle on the package's shared stack (newEnv's
// defaults), started by the first test that asks for it and stopped by
// TestMain. When t ends, the subscriptions it opened are closed and the
// workers it created are deleted; when it failed, the tails of the stack's
// logs are printed to it.
func sharedEnv(t *testing.T) *env {
	t.Helper()
	sharedStack.once.Do(func() {
		tb := &packageTB{}
		sharedStack.tb = tb
		defer func() {
			if p := recover(); p != nil {
				f, ok := p.(packageTBFatal)
				if !ok {
					panic(p)
				}
				sharedStack.err = errors.New(string(f))
				tb.cleanup()
			}
		}()
		sharedStack.env = newEnvWith(tb, envConfig{}).stackEnv
	})
	if sharedStack.err != nil {
		t.Fatalf("shared stack: %v", sharedStack.err)
	}
	e := &env{t: t, stackEnv: sharedStack.env, onShared: true}
	sharedTests.Store(t, e)
	before := e.workerIDs()
	e.mu.Lock()
	nsubs := len(e.subs)
	e.mu.Unlock()
	t.Cleanup(func() {
		sharedTests.Delete(t)
		e.mu.Lock()
		mine := append([]dispatch.Stream(nil), e.subs[nsubs:]...)
		e.subs = e.subs[:nsubs]
		e.mu.Unlock()
		for _, s := range mine {
			s.Close()
		}
		for id := range e.workerIDs() {
			if before[id] {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			if _, err := e.client.DeleteWorker(ctx, &pb.DeleteWorkerRequest{WorkerId: id}); err != nil {
				t.Logf("shared stack: deleting worker %s left by the test: %v", id, err)
			}
			cancel()
		}
		if t.Failed() {
			e.logTails(t)
		}
	})
	return e
}

// sharedTests maps a test on the shared stack to its env (workerDir).
var sharedTests sync.Map

// workerIDs lists the ids of every worker of the stack's catalog.
func (e *env) workerIDs() map[string]bool {
	e.t.Helper()
	ids := map[string]bool{}
	token := ""
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		resp, err := e.client.ListWorkers(ctx, &pb.ListWorkersRequest{PageToken: token})
		cancel()
		if err != nil {
			e.t.Fatalf("ListWorkers: %v", err)
		}
		for _, w := range resp.GetWorkers() {
			ids[w.GetWorkerId()] = true
		}
		if token = resp.GetNextPageToken(); token == "" {
			return ids
		}
	}
}

// stopSharedStack stops the shared stack, if a test started it (TestMain).
func stopSharedStack() {
	if tb := sharedStack.tb; tb != nil {
		tb.cleanup()
	}
}

// packageTB is the testing.TB the shared stack is started with: it lives
// for the package run, not for one test. Fatal panics (sharedEnv recovers
// it into an error for the test that started the stack); cleanups run
// when TestMain calls cleanup. Only what newEnvWith uses is implemented.
type packageTB struct {
	testing.TB // nil: any other method panics
	mu         sync.Mutex
	root       string
	n          int
	cleanups   []func()
}

type packageTBFatal string

func (p *packageTB) Helper()                   {}
func (p *packageTB) Name() string              { return "shared-stack" }
func (p *packageTB) Failed() bool              { return false }
func (p *packageTB) Logf(f string, a ...any)   { fmt.Fprintf(os.Stderr, "shared stack: "+f+"\n", a...) }
func (p *packageTB) Log(a ...any)              { p.Logf("%s", fmt.Sprint(a...)) }
func (p *packageTB) Fatal(a ...any)            { panic(packageTBFatal(fmt.Sprint(a...))) }
func (p *packageTB) Fatalf(f string, a ...any) { panic(packageTBFatal(fmt.Sprintf(f, a...))) }
func (p *packageTB) Errorf(f string, a ...any) { p.Fatalf(f, a...) }

func (p *packageTB) Cleanup(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cleanups = append(p.cleanups, f)
}

// TempDir returns a fresh directory under one root of the package run, so
// that filepath.Dir of any of them is that root (sharedRoot).
func (p *packageTB) TempDir() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.root == "" {
		root, err := os.MkdirTemp("", "wm-shared-stack-")
		if err != nil {
			panic(packageTBFatal(err.Error()))
		}
		p.root = root
		p.cleanups = append(p.cleanups, func() { os.RemoveAll(root) })
	}
	p.n++
	d := filepath.Join(p.root, fmt.Sprintf("%03d", p.n))
	if err := os.Mkdir(d, 0o700); err != nil {
		panic(packageTBFatal(err.Error()))
	}
	return d
}

// cleanup runs the cleanups, last registered first.
func (p *packageTB) cleanup() {
	p.mu.Lock()
	fs := p.cleanups
	p.cleanups = nil
	p.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

// TestSharedStack runs the tests that neither restart nor break their
// stack nor change its settings one after another on the shared stack
// (sharedEnv); as a whole it runs next to the other parallel tests, each on
// a stack of its own. `go test -run TestSharedStack/StopAndStart` runs one.
func TestSharedStack(t *testing.T) {
	inTurn(t)
	t.Cleanup(stopSharedStack)
	for _, tc := range []struct {
		name string
		test func(*testing.T)
	}{
		{"HealthAndReflection", testHealthAndReflection},
		{"TemporalCLIControlsWorker", testTemporalCLIControlsWorker},
		{"ExampleWorker", testExampleWorker},
		{"CreateProcessesAndPropagatesCorrelationID", testCreateProcessesAndPropagatesCorrelationID},
		{"StopAndStart", testStopAndStart},
		{"LoadCodeAndHistory", testLoadCodeAndHistory},
		{"BadInput", testBadInput},
		{"CreateWithRequestIDMakesOneWorker", testCreateWithRequestIDMakesOneWorker},
		{"WorkerNames", testWorkerNames},
		{"HungWorkerTimesOut", testHungWorkerTimesOut},
		{"FailuresSayWhere", testFailuresSayWhere},
		{"OversizeEventDeadLettersAndTopicFlows", testOversizeEventDeadLettersAndTopicFlows},
		{"DataWithoutContentType", testDataWithoutContentType},
		{"ReplayRealHistory", testReplayRealHistory},
		{"Quotas", testQuotas},
		{"RedisConfigCheck", testRedisConfigCheck},
		{"Guides", testGuides},
	} {
		t.Run(tc.name, tc.test)
	}
}
