package activities

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/failure"
	"github.com/virtufin/workmanager/internal/node/nodetest"
	"github.com/virtufin/workmanager/internal/state"
)

// flakyNode is a Node whose Check fails the first time (a check on a
// node that cannot run it).
type flakyNode struct {
	Node
	checks int
}

func (n *flakyNode) Check(ctx context.Context, w catalog.Worker, code []byte) error {
	if n.checks++; n.checks == 1 {
		return errors.New("mono: executable file not found in $PATH")
	}
	return n.Node.Check(ctx, w, code)
}

// Issue 33 item 4: a check that fails for a reason other than the code
// (retryable) leaves the upload staged, so the activity's retry succeeds
// instead of failing for good as "upload expired".
func TestPrepareCodeRetryAfterATransientCheckFailure(t *testing.T) {
	f, ctx := newFixture(t), context.Background()
	f.acts.Node = &flakyNode{Node: f.Node}
	sha, err := f.Catalog.StageCode(ctx, []byte("good"))
	if err != nil {
		t.Fatal(err)
	}
	in := PrepareCodeInput{Worker: worker(catalog.StatusRunning, ""), Ref: catalog.CodeRef{SHA256: sha, SourceKind: "content"}}
	if _, err := f.acts.PrepareCode(ctx, in); err == nil || failure.Kind(err) != "" {
		t.Fatalf("first attempt: want a retryable error, got %v", err)
	}
	if got, err := f.acts.PrepareCode(ctx, in); err != nil || got.SHA256 != sha {
		t.Fatalf("retry: %v %v", got, err)
	}
}

// Issue 33 item 3: a create never writes over a worker the catalog holds
// (a live worker whose workflow ended FAILED, until recovery starts it
// again): PrepareCode refuses it as AlreadyExists before anything else.
func TestPrepareCodeForACreateRefusesAnExistingRecord(t *testing.T) {
	f, ctx := newFixture(t), context.Background()
	w := worker(catalog.StatusRunning, "")
	if err := f.Catalog.SaveWorker(ctx, w); err != nil {
		t.Fatal(err)
	}
	sha, _ := f.Catalog.StageCode(ctx, []byte("good"))
	in := PrepareCodeInput{Worker: w, Ref: catalog.CodeRef{SHA256: sha, SourceKind: "content"}, Create: true}
	if _, err := f.acts.PrepareCode(ctx, in); failure.Kind(err) != failure.AlreadyExists {
		t.Fatalf("got %v, want AlreadyExists", err)
	}
	in.Create = false // a load_code of the same worker goes on
	if _, err := f.acts.PrepareCode(ctx, in); err != nil {
		t.Fatal(err)
	}
}

// Issue 33 item 7: a Delete whose removal was cut off after the history
// was deleted (its record's tombstone not written: the store failed), and
// then retried (reading no history), still leaves the worker's code blobs
// to the collection: the removal marked them before it removed anything.
func TestDeleteRetriedAfterAHalfRemovalStillCollectsTheCode(t *testing.T) {
	fault := filepath.Join(t.TempDir(), "fault")
	nf := nodetest.NewOnStore(t, func(st state.Store) state.Store { return state.WithFaultFile(st, fault) })
	f, ctx := &fixture{Fixture: nf, acts: &Activities{Catalog: nf.Catalog, Node: nf.Node, Events: nf.Events}}, context.Background()
	sha, _ := f.Catalog.PutCode(ctx, []byte("good"))
	w := worker(catalog.StatusRunning, sha)
	if err := f.Node.Apply(ctx, w, &catalog.HistoryEntry{Version: 1, SHA256: sha}); err != nil {
		t.Fatal(err)
	}
	record := state.KeyPrefix + "workers/" + w.ID
	if err := os.WriteFile(fault, []byte(record+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := f.acts.Delete(ctx, DeleteInput{Worker: w}); err == nil {
		t.Fatal("the first removal should fail (its tombstone's write)")
	}
	if _, err := f.Store.Get(ctx, record+"/history/head"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("the first removal left the history (%v): not cut off after it", err)
	}
	if err := os.Remove(fault); err != nil {
		t.Fatal(err)
	}
	if _, err := f.acts.Delete(ctx, DeleteInput{Worker: w}); err != nil {
		t.Fatal(err)
	}
	if n, err := f.Catalog.SweepCode(ctx, time.Hour, time.Now().Add(2*time.Hour)); n != 1 || err != nil {
		t.Fatalf("swept %d, %v; want the deleted worker's blob collected", n, err)
	}
}
