package activities

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"google.golang.org/protobuf/proto"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/cluster"
	"github.com/virtufin/workmanager/internal/codesource"
	"github.com/virtufin/workmanager/internal/failure"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/node/nodetest"
	"github.com/virtufin/workmanager/internal/state"
)

// The activities run here against the memory store, a real node and
// dispatcher, and a test engine (internal/node/nodetest); the real stack
// runs them in test/integration.

type fixture struct {
	*nodetest.Fixture
	acts *Activities
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	nf := nodetest.New(t)
	return &fixture{Fixture: nf, acts: &Activities{Catalog: nf.Catalog, Node: nf.Node, Events: nf.Events}}
}

func worker(status catalog.Status, sha string) catalog.Worker { return nodetest.Worker(status, sha) }

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
	sha, err := f.Catalog.StageCode(ctx, []byte("good"))
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
	if b, err := f.Catalog.GetCode(ctx, sha); err != nil || string(b) != "good" {
		t.Fatalf("stored code: %q %v", b, err)
	}
	// Dropped after the answer, not before it.
	enginetest.WaitFor(t, "the staged copy to be dropped", func() bool {
		_, err := f.Catalog.GetStaged(ctx, sha)
		return errors.Is(err, state.ErrNotFound)
	})
}

// putRecorder is a store that records the keys written.
type putRecorder struct {
	state.Store
	mu   sync.Mutex
	keys []string
}

func (p *putRecorder) Put(ctx context.Context, key string, value []byte, opts state.PutOptions) error {
	p.mu.Lock()
	p.keys = append(p.keys, key)
	p.mu.Unlock()
	return p.Store.Put(ctx, key, value, opts)
}

func (p *putRecorder) written() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.keys...)
}

// A rollback loads a version its history names: checked, not stored again
// (the sweep keeps what a history names).
func TestPrepareCodeOfARollbackWritesNothing(t *testing.T) {
	rec := &putRecorder{}
	nf := nodetest.NewOnStore(t, func(s state.Store) state.Store { rec.Store = s; return rec })
	acts := &Activities{Catalog: nf.Catalog, Node: nf.Node, Events: nf.Events}
	ctx := context.Background()
	sha, err := nf.Catalog.PutCode(ctx, []byte("good"))
	if err != nil {
		t.Fatal(err)
	}
	before := len(rec.written())
	ref := catalog.CodeRef{SHA256: sha, SourceKind: "content", RollbackTo: 1}
	if got, err := acts.PrepareCode(ctx, PrepareCodeInput{Worker: worker(catalog.StatusRunning, sha), Ref: ref}); err != nil || got != ref {
		t.Fatalf("PrepareCode of a rollback: %v %v", got, err)
	}
	if w := rec.written()[before:]; len(w) != 0 {
		t.Fatalf("a rollback's PrepareCode wrote %v", w)
	}
	// Its code refused (gone from the store) is still refused.
	bad := catalog.CodeRef{SHA256: catalog.SHA256([]byte("gone")), SourceKind: "content", RollbackTo: 1}
	_, err = acts.PrepareCode(ctx, PrepareCodeInput{Worker: worker(catalog.StatusRunning, sha), Ref: bad})
	wantInvalidArgument(t, err, "no longer stored")
}

func TestPrepareCodeRejectsBadCodeAndStoresNothing(t *testing.T) {
	f, ctx := newFixture(t), context.Background()
	sha, err := f.Catalog.StageCode(ctx, []byte(nodetest.BadCode))
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.acts.PrepareCode(ctx, PrepareCodeInput{Worker: worker(catalog.StatusRunning, ""), Ref: catalog.CodeRef{SHA256: sha, SourceKind: "content"}})
	wantInvalidArgument(t, err, "nothing good here")
	if _, err := f.Catalog.GetCode(ctx, sha); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("bad code must not be stored: %v", err)
	}
	if _, err := f.Catalog.GetStaged(ctx, sha); !errors.Is(err, state.ErrNotFound) {
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
		"expired upload": {catalog.CodeRef{SHA256: missing, SourceKind: "content"}, "expired before it was loaded"},
		"unknown kind":   {catalog.CodeRef{SHA256: missing, SourceKind: "ftp"}, `unknown source kind "ftp"`},
		"relative URL":   {catalog.CodeRef{SHA256: missing, SourceKind: "url", URL: "worker.py"}, "absolute http or https URL"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := f.acts.PrepareCode(ctx, PrepareCodeInput{Worker: worker(catalog.StatusRunning, ""), Ref: c.ref})
			wantInvalidArgument(t, err, c.want)
		})
	}
	// A URL the SSRF rules refuse is PermissionDenied, never retried.
	for _, u := range []string{"file:///etc/passwd", "http://169.254.169.254/latest/meta-data/", "http://2130706433/"} {
		_, err := f.acts.PrepareCode(ctx, PrepareCodeInput{Worker: worker(catalog.StatusRunning, ""),
			Ref: catalog.CodeRef{SHA256: missing, SourceKind: "url", URL: u}})
		var appErr *temporal.ApplicationError
		if !errors.As(err, &appErr) || appErr.Type() != failure.PermissionDenied || !appErr.NonRetryable() || !strings.Contains(err.Error(), "refused by rule") {
			t.Errorf("%s: want a non-retryable PermissionDenied error, got %v", u, err)
		}
	}
}

func TestApplyAttachesPersistsAndDetaches(t *testing.T) {
	f, ctx := newFixture(t), context.Background()
	sha, err := f.Catalog.PutCode(ctx, []byte("good"))
	if err != nil {
		t.Fatal(err)
	}
	w := worker(catalog.StatusRunning, sha)
	in := ApplyInput{Worker: w, History: &catalog.HistoryEntry{Version: 1, SHA256: sha, SourceKind: "content"}}
	for range 2 { // idempotent: a retry neither loads twice nor adds history
		if _, err := f.acts.Apply(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	if !f.Dispatcher.Attached("w1") || f.Engine.Loads() != 1 {
		t.Fatalf("attached %v, loads %d", f.Dispatcher.Attached("w1"), f.Engine.Loads())
	}
	if got, err := f.Catalog.GetWorker(ctx, "w1"); err != nil || got.Status != catalog.StatusRunning {
		t.Fatalf("persisted: %+v %v", got, err)
	}
	if h, err := f.Catalog.History(ctx, "w1"); err != nil || len(h) != 1 {
		t.Fatalf("history: %+v %v", h, err)
	}
	if evs := f.Published.All(); len(evs) != 0 {
		t.Fatalf("no events asked for, got %v", evs)
	}

	w.Status = catalog.StatusStopped
	if _, err := f.acts.Apply(ctx, ApplyInput{Worker: w}); err != nil {
		t.Fatal(err)
	}
	if f.Dispatcher.Attached("w1") {
		t.Fatal("a stopped worker must be detached")
	}
	if evs := f.Published.All(); len(evs) != 0 {
		t.Fatalf("Apply publishes nothing (Emit does, later): %+v", evs)
	}
}

// Code that is missing from the store cannot be attached, and then nothing
// is persisted.
func TestApplyWithMissingCodePersistsNothing(t *testing.T) {
	f, ctx := newFixture(t), context.Background()
	w := worker(catalog.StatusRunning, catalog.SHA256([]byte("not stored")))
	if _, err := f.acts.Apply(ctx, ApplyInput{Worker: w}); err == nil {
		t.Fatal("Apply must fail without the code")
	}
	if _, err := f.Catalog.GetWorker(ctx, "w1"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("nothing may be persisted: %v", err)
	}
	if f.Dispatcher.Attached("w1") {
		t.Fatal("nothing may be attached")
	}
}

func TestDeleteActivateAndEmit(t *testing.T) {
	f, ctx := newFixture(t), context.Background()
	sha, _ := f.Catalog.PutCode(ctx, []byte("good"))
	w := worker(catalog.StatusRunning, sha)
	if _, err := f.acts.Apply(ctx, ApplyInput{Worker: w}); err != nil {
		t.Fatal(err)
	}
	// Another node deleted the record: Activate makes this node match.
	if err := f.Catalog.DeleteWorker(ctx, "w1"); err != nil {
		t.Fatal(err)
	}
	if err := f.acts.Activate(ctx, "w1"); err != nil || f.Dispatcher.Attached("w1") {
		t.Fatalf("Activate after delete: %v, attached %v", err, f.Dispatcher.Attached("w1"))
	}
	// Delete publishes nothing; Emit publishes later.
	if _, err := f.acts.Delete(ctx, DeleteInput{Worker: w}); err != nil {
		t.Fatal(err)
	}
	if evs := f.Published.All(); len(evs) != 0 {
		t.Fatalf("Delete published %v", evs)
	}
	if err := f.acts.Emit(ctx, EmitInput{Worker: w, Events: []EventSpec{{ID: "e-del", Kind: lifecycleevents.Deleted}}}); err != nil {
		t.Fatal(err)
	}
	evs := f.Published.All()
	if len(evs) != 1 || evs[0].Event.ID() != "e-del" || evs[0].Event.Type() != lifecycleevents.TypePrefix+"deleted" {
		t.Fatalf("deleted event: %+v", evs)
	}
	var d lifecycleevents.Data
	if err := evs[0].Event.DataAs(&d); err != nil || d.WorkerID != "w1" || d.Topic != "in" || d.Group != "g" {
		t.Fatalf("event data: %+v %v", d, err)
	}
}

func TestListNodes(t *testing.T) {
	f, ctx := newFixture(t), context.Background()
	if ids, err := f.acts.ListNodes(ctx); err != nil || len(ids) != 0 {
		t.Fatalf("without membership: %v %v", ids, err)
	}
	members := cluster.New(f.Store, "n1", time.Minute)
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
	sha, _ := f.Catalog.PutCode(ctx, []byte("good"))
	for _, id := range []string{"a", "b", "c"} {
		w := worker(catalog.StatusStopped, sha)
		w.ID = id
		if _, err := f.acts.Apply(ctx, ApplyInput{Worker: w}); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Catalog.DeleteWorker(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	ids, err := f.acts.ListWorkerIDs(ctx)
	slices.Sort(ids) // the index's pages are not in creation order
	if err != nil || fmt.Sprint(ids) != "[a c]" {
		t.Fatalf("ids: %v %v", ids, err)
	}
	ws, err := f.acts.GetWorkers(ctx, []string{"a", "b", "c"})
	if err != nil || len(ws) != 2 || ws[0].ID != "a" || ws[1].ID != "c" {
		t.Fatalf("workers: %+v %v", ws, err)
	}
}

// A URL source without a sha256 (allowed by CODE_URL_ALLOW_UNPINNED) is
// pinned when fetched: the ref comes back with the SHA-256 of what was
// stored, so recovery loads exactly that and never fetches again.
func TestPrepareCodePinsAnUnpinnedURL(t *testing.T) {
	f, ctx := newFixture(t), context.Background()
	body := []byte("good")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) }))
	defer srv.Close()
	f.acts.Fetcher = codesource.Fetcher{Policy: codesource.Policy{AllowLoopback: true, AllowUnpinned: true}}
	ref, err := f.acts.PrepareCode(ctx, PrepareCodeInput{Worker: worker(catalog.StatusRunning, ""),
		Ref: catalog.CodeRef{SourceKind: "url", URL: srv.URL + "/w.py"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := catalog.SHA256(body); ref.SHA256 != want || ref.URL != srv.URL+"/w.py" {
		t.Fatalf("ref %+v, want sha256 %s", ref, want)
	}
	if got, err := f.Catalog.GetCode(ctx, ref.SHA256); err != nil || string(got) != "good" {
		t.Fatalf("stored %q %v", got, err)
	}
}

// PrepareCode heartbeats while it fetches and checks: the workflow gives it
// a heartbeat timeout (workflows.ApplyHeartbeat), so that an attempt lost
// with its node fails in seconds, and a slow fetch or .NET compile must
// not be taken for a lost attempt.
func TestPrepareCodeHeartbeatsWhileItWorks(t *testing.T) {
	f := newFixture(t)
	body := []byte("good")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(heartbeatInterval + heartbeatInterval/2) // a slow source
		_, _ = w.Write(body)
	}))
	defer srv.Close()
	f.acts.Fetcher = codesource.Fetcher{Policy: codesource.Policy{AllowLoopback: true}}
	var ts testsuite.WorkflowTestSuite
	env := ts.NewTestActivityEnvironment()
	env.RegisterActivity(f.acts)
	var beats atomic.Int32
	env.SetOnActivityHeartbeatListener(func(*activity.Info, converter.EncodedValues) { beats.Add(1) })
	ref := catalog.CodeRef{SourceKind: "url", URL: srv.URL + "/w.py", SHA256: catalog.SHA256(body)}
	v, err := env.ExecuteActivity(f.acts.PrepareCode, PrepareCodeInput{Worker: worker(catalog.StatusRunning, ""), Ref: ref})
	if err != nil {
		t.Fatal(err)
	}
	var got catalog.CodeRef
	if err := v.Get(&got); err != nil || got.SHA256 != ref.SHA256 {
		t.Fatalf("ref %+v %v", got, err)
	}
	if beats.Load() == 0 {
		t.Fatalf("PrepareCode sent no heartbeat in %v of work", heartbeatInterval+heartbeatInterval/2)
	}
}

// Issue 42, item 5: an error of any size (a worker's 20 MB import error)
// becomes a Temporal failure of a few KiB, of the same kind, that starts
// as the error does.
func TestClassifyBoundsTheText(t *testing.T) {
	huge := strings.Repeat("x", 20<<20)
	errStore := errors.New("state store")
	for _, c := range []struct {
		cause error
		kind  string
	}{
		{engines.ErrInvalidCode, failure.InvalidArgument},
		{codesource.ErrForbidden, failure.PermissionDenied},
		{errStore, ""},
	} {
		in := fmt.Errorf("%w: ImportError: %s", c.cause, huge)
		err := classify(in)
		if n := len(err.Error()); n > maxFailureText+256 {
			t.Errorf("%v: a failure of %d bytes", c.cause, n)
		}
		if failure.Kind(err) != c.kind {
			t.Errorf("%v: kind %q, want %q", c.cause, failure.Kind(err), c.kind)
		}
		if msg := failure.Message(err); !strings.HasPrefix(msg, in.Error()[:100]) {
			t.Errorf("%v: message %.100q", c.cause, msg)
		}
		if c.kind == "" && !errors.Is(err, errStore) {
			t.Errorf("the cause of a retryable error is lost: %.100v", err)
		}
		// What Temporal stores and sends: the failure and its causes.
		f := temporal.GetDefaultFailureConverter().ErrorToFailure(err)
		if n := proto.Size(f); n > maxFailureText+1024 {
			t.Errorf("%v: the Temporal failure is %d bytes", c.cause, n)
		}
	}
}

// A create's checks run beside the read of an uploaded body, with the
// same answers: a create of an id that has a record is refused
// AlreadyExists whether or not its body is still staged; a URL is not
// fetched for a create refused so.
func TestPrepareCodeRefusesACreateOverARecordWhateverItsBody(t *testing.T) {
	f, ctx := newFixture(t), context.Background()
	sha, _ := f.Catalog.PutCode(ctx, []byte("good"))
	w := worker(catalog.StatusRunning, sha)
	w.Incarnation, w.Revision = "run-1", 1
	if _, err := f.acts.Apply(ctx, ApplyInput{Worker: w}); err != nil {
		t.Fatal(err)
	}
	var fetched atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		fetched.Add(1)
		_, _ = rw.Write([]byte("good"))
	}))
	defer srv.Close()
	f.acts.Fetcher = codesource.Fetcher{Policy: codesource.Policy{AllowLoopback: true}}
	staged, _ := f.Catalog.StageCode(ctx, []byte("good"))
	for name, ref := range map[string]catalog.CodeRef{
		"staged":  {SHA256: staged, SourceKind: "content"},
		"expired": {SHA256: catalog.SHA256([]byte("never staged")), SourceKind: "content"},
		"url":     {SourceKind: "url", URL: srv.URL + "/w.py", SHA256: catalog.SHA256([]byte("good"))},
	} {
		_, err := f.acts.PrepareCode(ctx, PrepareCodeInput{Worker: w, Ref: ref, Create: true})
		if failure.Kind(err) != failure.AlreadyExists {
			t.Fatalf("%s: a create over a record: %v; want AlreadyExists", name, err)
		}
	}
	if n := fetched.Load(); n != 0 {
		t.Fatalf("the URL was fetched %d times for a refused create", n)
	}
	if _, err := f.Catalog.GetStaged(ctx, staged); err != nil {
		t.Fatalf("the staged body of a refused create was dropped: %v", err)
	}
}
