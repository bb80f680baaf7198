package activities

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/failure"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
)

// Issue 43 item 13 (a): a deleted worker's id (its name's or request id's
// name-based UUID) was refused only by Temporal's reuse policy, which
// forgets the completed workflow once its retention has passed: the create
// of a new run then went through (its tombstone let a new incarnation
// write). The tombstone now says the worker existed, and a create of its
// id is refused for ever; a failed create's undo (a Delete without the
// deleted event) leaves the id free for the request's retry.
func TestDeletedWorkerIsNotCreatedAgainAfterRetention(t *testing.T) {
	f, ctx := newFixture(t), context.Background()
	sha, _ := f.Catalog.PutCode(ctx, []byte("good"))
	create := func(incarnation string) catalog.Worker {
		t.Helper()
		w := worker(catalog.StatusRunning, sha)
		w.Incarnation, w.Revision = incarnation, 1
		staged, _ := f.Catalog.StageCode(ctx, []byte("good"))
		if _, err := f.acts.PrepareCode(ctx, PrepareCodeInput{Worker: w, Ref: catalog.CodeRef{SHA256: staged, SourceKind: "content"}, Create: true}); err != nil {
			t.Fatalf("PrepareCode of the create of incarnation %s: %v", incarnation, err)
		}
		if _, err := f.acts.Apply(ctx, ApplyInput{Worker: w}); err != nil {
			t.Fatal(err)
		}
		return w
	}

	// A failed create, undone: the request may be tried again in a new run.
	failed := create("run-1")
	if _, err := f.acts.Delete(ctx, DeleteInput{Worker: failed}); err != nil {
		t.Fatal(err)
	}
	// Created, then deleted (the deleted event is published by Emit).
	w := create("run-2")
	if _, err := f.acts.Delete(ctx, DeleteInput{Worker: w}); err != nil {
		t.Fatal(err)
	}
	if err := f.acts.Emit(ctx, EmitInput{Worker: w, Events: []EventSpec{{ID: "e-del", Kind: lifecycleevents.Deleted}}}); err != nil {
		t.Fatal(err)
	}
	// Temporal forgot the deleted worker's workflow: the API's start of a
	// new run of its id succeeds, and the create gets as far as PrepareCode.
	again := worker(catalog.StatusRunning, sha)
	again.Incarnation = "run-3"
	staged, _ := f.Catalog.StageCode(ctx, []byte("good"))
	_, err := f.acts.PrepareCode(ctx, PrepareCodeInput{Worker: again, Ref: catalog.CodeRef{SHA256: staged, SourceKind: "content"}, Create: true})
	if failure.Kind(err) != failure.AlreadyExists || !strings.Contains(err.Error(), "deleted") {
		t.Fatalf("a create of a deleted worker's id: %v; want AlreadyExists saying it was deleted", err)
	}
	if _, err := f.Catalog.GetWorker(ctx, w.ID); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("the deleted worker: %v; want ErrNotFound", err)
	}
}

// Issue 43 item 2: why recovery could not bring a worker back is recorded
// with its not_recovered event (GetWorker's status_reason), and forgotten
// once the worker loads again on a node, or is deleted.
func TestNotRecoveredReasonIsKeptUntilTheWorkerLoads(t *testing.T) {
	f, ctx := newFixture(t), context.Background()
	sha, _ := f.Catalog.PutCode(ctx, []byte("good"))
	w := worker(catalog.StatusRunning, sha)
	cause := errors.New("load worker w1: this node cannot load me")
	ev := EventSpec{ID: "e-nr", Kind: lifecycleevents.Error, ErrorType: NotRecoveredType, ErrorMessage: NotRecoveredMessage(w.ID, cause)}
	reason := func() string {
		t.Helper()
		n, ok, err := f.Catalog.GetNotRecovered(ctx, w.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return ""
		}
		return n.Reason
	}
	if err := f.acts.Emit(ctx, EmitInput{Worker: w, Events: []EventSpec{ev}}); err != nil {
		t.Fatal(err)
	}
	if got := reason(); got != cause.Error() {
		t.Fatalf("recorded reason %q, want %q", got, cause)
	}
	if evs := f.Published.All(); len(evs) != 1 {
		t.Fatalf("published %d events, want the not_recovered one", len(evs))
	}
	if _, err := f.acts.Apply(ctx, ApplyInput{Worker: w}); err != nil || !f.Dispatcher.Attached(w.ID) {
		t.Fatalf("Apply: %v", err)
	}
	if got := reason(); got != "" {
		t.Fatalf("after the worker loaded: reason %q, want none", got)
	}
	if err := f.acts.Emit(ctx, EmitInput{Worker: w, Events: []EventSpec{ev}}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.acts.Delete(ctx, DeleteInput{Worker: w}); err != nil {
		t.Fatal(err)
	}
	if got := reason(); got != "" {
		t.Fatalf("after the delete: reason %q, want none", got)
	}
}

// The reason GetWorker shows is the worker's error, without Temporal's
// frame around an activity's failure.
func TestNotRecoveredReasonDropsTemporalsFrame(t *testing.T) {
	id := "6f914b83-19be-4dfd-a48e-1d0d57457d54"
	for cause, want := range map[string]string{
		"activity error (type: Activate, scheduledEventID: 151, startedEventID: 157, identity: 10790@vm@): load worker " + id +
			": invalid worker code: RuntimeError: this node cannot load me (line 3) (type: InvalidArgument, retryable: false)": "load worker " + id + ": invalid worker code: RuntimeError: this node cannot load me (line 3)",
		"activity error (type: Activate, scheduledEventID: 9, startedEventID: 0, identity: ): activity ScheduleToClose timeout (type: ScheduleToClose)": "activity ScheduleToClose timeout (type: ScheduleToClose)",
		"child workflow start failed": "child workflow start failed",
	} {
		if got := NotRecoveredReason(id, NotRecoveredMessage(id, errors.New(cause))); got != want {
			t.Errorf("reason of %q:\n got %q\nwant %q", cause, got, want)
		}
	}
}
