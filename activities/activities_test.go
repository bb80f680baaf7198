package activities

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"
	"go.temporal.io/sdk/temporal"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/cluster"
	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/failure"
	"github.com/virtufin/workmanager/internal/lifecycle"
	"github.com/virtufin/workmanager/internal/node"
	"github.com/virtufin/workmanager/internal/state"
)

// The activities run here against the memory store, a real node and
// dispatcher, and a test engine; the real stack runs them in
// test/integration.

const mimeType = "text/x-test"

// testEngine accepts any code but "bad", and counts loaded instances.
type testEngine struct {
	mu    sync.Mutex
	loads int
}

func (e *testEngine) Info() engines.Info {
	return engines.Info{Name: "test", MIMETypes: []string{mimeType}}
}

func (e *testEngine) Check(_ context.Context, _ engines.Spec, code []byte) error {
	if string(code) == "bad" {
		return fmt.Errorf("%w: line 1: nothing good here", engines.ErrInvalidCode)
	}
	return nil
}

func (e *testEngine) Load(ctx context.Context, s engines.Spec, code []byte) (engines.Instance, error) {
	if err := e.Check(ctx, s, code); err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.loads++
	e.mu.Unlock()
	return instance{}, nil
}

type instance struct{}

func (instance) Process(context.Context, *event.Event) ([]event.Event, error) { return nil, nil }
func (instance) Close(context.Context) error                                  { return nil }

// idleSubscriber opens streams that never deliver.
type idleSubscriber struct{}

func (idleSubscriber) Subscribe(ctx context.Context, _, _ string) (dispatch.Stream, error) {
	sctx, cancel := context.WithCancel(ctx)
	return idleStream{ctx: sctx, cancel: cancel}, nil
}

type idleStream struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func (s idleStream) Recv() (*runtimev1.TopicEventRequest, error) { <-s.ctx.Done(); return nil, io.EOF }
func (s idleStream) Ack(string, dispatch.Ack) error              { return nil }
func (s idleStream) Close()                                      { s.cancel() }

type published struct {
	topic string
	ev    event.Event
}

type recorder struct {
	mu  sync.Mutex
	evs []published
}

func (r *recorder) Publish(_ context.Context, topic string, e *event.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evs = append(r.evs, published{topic, e.Clone()})
	return nil
}

func (r *recorder) all() []published {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]published(nil), r.evs...)
}

type fixture struct {
	acts   *Activities
	store  *state.MemoryStore
	cat    *catalog.Catalog
	disp   *dispatch.Dispatcher
	engine *testEngine
	pub    *recorder
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f := &fixture{store: state.NewMemoryStore(), engine: &testEngine{}, pub: &recorder{}}
	f.cat = catalog.New(f.store)
	reg := engines.NewRegistry()
	if err := reg.Register(f.engine); err != nil {
		t.Fatal(err)
	}
	events := lifecycle.NewEmitter(f.pub)
	f.disp = dispatch.New(ctx, log, idleSubscriber{}, f.pub, events, dispatch.Config{PubSub: "pubsub", MaxConcurrency: 1})
	n := node.New(log, f.cat, reg, f.disp, time.Second)
	t.Cleanup(func() { n.Shutdown(context.Background()) })
	f.acts = &Activities{Catalog: f.cat, Node: n, Events: events}
	return f
}

func worker(status catalog.Status, sha string) catalog.Worker {
	return catalog.Worker{ID: "w1", MIMEType: mimeType, Topic: "in", Group: "g", Status: status, CodeVersion: 1, CodeSHA256: sha}
}

// wantInvalidArgument asserts a non-retryable InvalidArgument error that
// mentions want.
func wantInvalidArgument(t *testing.T, err error, want string) {
	t.Helper()
	var app *temporal.ApplicationError
	if !errors.As(err, &app) || app.Type() != failure.InvalidArgument || !app.NonRetryable() {
		t.Fatalf("want a non-retryable %s error, got %v", failure.InvalidArgument, err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not say %q", err, want)
	}
}

func TestPrepareCodeMovesStagedCodeToTheStore(t *testing.T) {
	f, ctx := newFixture(t), context.Background()
	sha, err := f.cat.StageCode(ctx, []byte("good"))
	if err != nil {
		t.Fatal(err)
	}
	ref := catalog.CodeRef{SHA256: sha, SourceKind: "content"}
	for range 2 { // a retried activity finds the code already moved
		got, err := f.acts.PrepareCode(ctx, PrepareCodeInput{Worker: worker(catalog.StatusRunning, ""), Ref: ref})
		if err != nil || got != ref {
			t.Fatalf("PrepareCode: %v %v", got, err)
		}
	}
	if b, err := f.cat.GetCode(ctx, sha); err != nil || string(b) != "good" {
		t.Fatalf("stored code: %q %v", b, err)
	}
	if _, err := f.cat.GetStaged(ctx, sha); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("staged copy should be gone: %v", err)
	}
}

func TestPrepareCodeRejectsBadCodeAndStoresNothing(t *testing.T) {
	f, ctx := newFixture(t), context.Background()
	sha, err := f.cat.StageCode(ctx, []byte("bad"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.acts.PrepareCode(ctx, PrepareCodeInput{Worker: worker(catalog.StatusRunning, ""), Ref: catalog.CodeRef{SHA256: sha, SourceKind: "content"}})
	wantInvalidArgument(t, err, "nothing good here")
	if _, err := f.cat.GetCode(ctx, sha); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("bad code must not be stored: %v", err)
	}
	if _, err := f.cat.GetStaged(ctx, sha); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("bad code must not stay staged: %v", err)
	}
}

func TestPrepareCodeBadSources(t *testing.T) {
	f, ctx := newFixture(t), context.Background()
	missing := catalog.SHA256([]byte("never uploaded"))
	for name, c := range map[string]struct {
		ref  catalog.CodeRef
		want string
	}{
		"expired upload":  {catalog.CodeRef{SHA256: missing, SourceKind: "content"}, "expired before it was loaded"},
		"unknown kind":    {catalog.CodeRef{SHA256: missing, SourceKind: "ftp"}, `unknown source kind "ftp"`},
		"relative URL":    {catalog.CodeRef{SHA256: missing, SourceKind: "url", URL: "worker.py"}, "absolute http or https URL"},
		"unsupported URL": {catalog.CodeRef{SHA256: missing, SourceKind: "url", URL: "file:///etc/passwd"}, "absolute http or https URL"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := f.acts.PrepareCode(ctx, PrepareCodeInput{Worker: worker(catalog.StatusRunning, ""), Ref: c.ref})
			wantInvalidArgument(t, err, c.want)
		})
	}
}

func TestApplyAttachesPersistsAndDetaches(t *testing.T) {
	f, ctx := newFixture(t), context.Background()
	sha, err := f.cat.PutCode(ctx, []byte("good"))
	if err != nil {
		t.Fatal(err)
	}
	w := worker(catalog.StatusRunning, sha)
	in := ApplyInput{Worker: w, History: &catalog.HistoryEntry{Version: 1, SHA256: sha, SourceKind: "content"}}
	for range 2 { // idempotent: a retry neither loads twice nor adds history
		if err := f.acts.Apply(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	if !f.disp.Attached("w1") || f.engine.loads != 1 {
		t.Fatalf("attached %v, loads %d", f.disp.Attached("w1"), f.engine.loads)
	}
	if got, err := f.cat.GetWorker(ctx, "w1"); err != nil || got.Status != catalog.StatusRunning {
		t.Fatalf("persisted: %+v %v", got, err)
	}
	if h, err := f.cat.History(ctx, "w1"); err != nil || len(h) != 1 {
		t.Fatalf("history: %+v %v", h, err)
	}
	if evs := f.pub.all(); len(evs) != 0 {
		t.Fatalf("no events asked for, got %v", evs)
	}

	w.Status = catalog.StatusStopped
	if err := f.acts.Apply(ctx, ApplyInput{Worker: w, Events: []EventSpec{{ID: "e-stop", Kind: lifecycle.Stopped}}}); err != nil {
		t.Fatal(err)
	}
	if f.disp.Attached("w1") {
		t.Fatal("a stopped worker must be detached")
	}
	evs := f.pub.all()
	if len(evs) != 1 || evs[0].topic != lifecycle.Topic || evs[0].ev.ID() != "e-stop" || evs[0].ev.Type() != lifecycle.TypePrefix+"stopped" {
		t.Fatalf("stopped event: %+v", evs)
	}
}

// Code that is missing from the store cannot be attached, and then nothing
// is persisted.
func TestApplyWithMissingCodePersistsNothing(t *testing.T) {
	f, ctx := newFixture(t), context.Background()
	w := worker(catalog.StatusRunning, catalog.SHA256([]byte("not stored")))
	if err := f.acts.Apply(ctx, ApplyInput{Worker: w}); err == nil {
		t.Fatal("Apply must fail without the code")
	}
	if _, err := f.cat.GetWorker(ctx, "w1"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("nothing may be persisted: %v", err)
	}
	if f.disp.Attached("w1") {
		t.Fatal("nothing may be attached")
	}
}

func TestDeleteActivateAndEmit(t *testing.T) {
	f, ctx := newFixture(t), context.Background()
	sha, _ := f.cat.PutCode(ctx, []byte("good"))
	w := worker(catalog.StatusRunning, sha)
	if err := f.acts.Apply(ctx, ApplyInput{Worker: w}); err != nil {
		t.Fatal(err)
	}
	// Another node deleted the record: Activate makes this node match.
	if err := f.cat.DeleteWorker(ctx, "w1"); err != nil {
		t.Fatal(err)
	}
	if err := f.acts.Activate(ctx, "w1"); err != nil || f.disp.Attached("w1") {
		t.Fatalf("Activate after delete: %v, attached %v", err, f.disp.Attached("w1"))
	}
	// Delete without an event id publishes nothing; Emit publishes later.
	if err := f.acts.Delete(ctx, DeleteInput{Worker: w}); err != nil {
		t.Fatal(err)
	}
	if evs := f.pub.all(); len(evs) != 0 {
		t.Fatalf("Delete without EventID published %v", evs)
	}
	if err := f.acts.Emit(ctx, EmitInput{Worker: w, Events: []EventSpec{{ID: "e-del", Kind: lifecycle.Deleted}}}); err != nil {
		t.Fatal(err)
	}
	evs := f.pub.all()
	if len(evs) != 1 || evs[0].ev.ID() != "e-del" || evs[0].ev.Type() != lifecycle.TypePrefix+"deleted" {
		t.Fatalf("deleted event: %+v", evs)
	}
	var d lifecycle.Data
	if err := evs[0].ev.DataAs(&d); err != nil || d.WorkerID != "w1" || d.Topic != "in" || d.Group != "g" {
		t.Fatalf("event data: %+v %v", d, err)
	}
}

func TestListNodes(t *testing.T) {
	f, ctx := newFixture(t), context.Background()
	if ids, err := f.acts.ListNodes(ctx); err != nil || len(ids) != 0 {
		t.Fatalf("without membership: %v %v", ids, err)
	}
	members := cluster.New(f.store, "n1", time.Minute)
	f.acts.Members = members
	if err := members.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if ids, err := f.acts.ListNodes(ctx); err != nil || len(ids) != 1 || ids[0] != "n1" {
		t.Fatalf("with membership: %v %v", ids, err)
	}
}

func TestListWorkerIDsAndGetWorkersSkipDeleted(t *testing.T) {
	f, ctx := newFixture(t), context.Background()
	sha, _ := f.cat.PutCode(ctx, []byte("good"))
	for _, id := range []string{"a", "b", "c"} {
		w := worker(catalog.StatusStopped, sha)
		w.ID = id
		if err := f.acts.Apply(ctx, ApplyInput{Worker: w}); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.cat.DeleteWorker(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	ids, err := f.acts.ListWorkerIDs(ctx)
	if err != nil || fmt.Sprint(ids) != "[a c]" {
		t.Fatalf("ids: %v %v", ids, err)
	}
	ws, err := f.acts.GetWorkers(ctx, []string{"a", "b", "c"})
	if err != nil || len(ws) != 2 || ws[0].ID != "a" || ws[1].ID != "c" {
		t.Fatalf("workers: %+v %v", ws, err)
	}
}
