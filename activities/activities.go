// Package activities owns the side effects of worker lifecycle workflows:
// fetching and verifying code, load-checking it with its engine, persisting
// config, history and code, attaching and detaching workers on this node, and
// publishing lifecycle events. Every activity is idempotent so that Temporal
// may retry it; errors caused by the request itself are returned as
// non-retryable application errors of type failure.InvalidArgument.
package activities

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/codesource"
	"github.com/virtufin/workmanager/internal/failure"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/state"
)

// Node is what activities need of the node they run on (internal/node),
// which owns the ordering rule: attach or detach first, then persist, under
// one lock, so a worker that cannot be attached is never persisted.
type Node interface {
	// Check load-checks code for w with its engine without running it.
	Check(ctx context.Context, w catalog.Worker, code []byte) error
	// Apply attaches (or detaches, when stopped) w, then persists it and
	// history (when not nil).
	Apply(ctx context.Context, w catalog.Worker, history *catalog.HistoryEntry) error
	// Remove detaches the worker, then deletes its record (refused when
	// the record is another incarnation's: catalog.RemoveWorker).
	Remove(ctx context.Context, w catalog.Worker) error
	// Sync makes this node match the persisted record of id.
	Sync(ctx context.Context, id string) error
}

// Members lists the live nodes (internal/cluster).
type Members interface {
	Alive(ctx context.Context) ([]string, error)
}

// Activities carries the dependencies of every activity.
type Activities struct {
	Catalog *catalog.Catalog
	Node    Node
	Events  *lifecycleevents.Emitter
	Fetcher codesource.Fetcher
	Members Members
	// Placement, when set, places topics on nodes (placement.go).
	Placement *Placement
}

// PrepareCodeInput names the code a worker is about to load.
type PrepareCodeInput struct {
	Worker catalog.Worker
	Ref    catalog.CodeRef
	// Create: the worker must have no record yet. A create never writes
	// over a live worker whose workflow was lost (ended FAILED while the
	// worker runs, until recovery starts it again): AlreadyExists.
	Create bool
}

// PrepareCode gets the code body (from the staging area or its URL), checks
// its SHA-256, load-checks it with the worker's engine and stores it under
// its SHA-256. Nothing is stored when any step fails. The staged upload is
// dropped only when the code itself is refused: after a failure that may
// pass (a node that cannot check this code, a check cut off by the
// activity's timeout) the retry finds it still there.
func (a *Activities) PrepareCode(ctx context.Context, in PrepareCodeInput) (catalog.CodeRef, error) {
	defer heartbeatWhileRunning(ctx)()
	// A create's checks (no record, no tombstone) run beside the read of
	// the body: three reads of the state store at once rather than one
	// after another (a Python create's 1.3–1.9 ms became 0.6–1.2). A URL
	// is fetched only once they passed.
	createAllowed := func() error { return nil }
	if in.Create {
		createAllowed = a.startCreateChecks(ctx, in.Worker.ID)
	}
	var body []byte
	var err error
	switch {
	case in.Ref.RollbackTo > 0:
		// A rollback loads a version's code again from the code store.
		if body, err = a.Catalog.GetCode(ctx, in.Ref.SHA256); errors.Is(err, state.ErrNotFound) {
			err = fmt.Errorf("%w: the code of version %d (%s) is no longer stored", codesource.ErrInvalid, in.Ref.RollbackTo, in.Ref.SHA256)
		}
	case in.Ref.SourceKind == "url":
		if err = createAllowed(); err == nil {
			body, err = a.Fetcher.Fetch(ctx, in.Ref.URL, in.Ref.SHA256)
		}
	case in.Ref.SourceKind == "content":
		body, err = a.Catalog.GetStaged(ctx, in.Ref.SHA256)
		if errors.Is(err, state.ErrNotFound) {
			// Already moved by an earlier attempt of this activity?
			if body, err = a.Catalog.GetCode(ctx, in.Ref.SHA256); errors.Is(err, state.ErrNotFound) {
				err = fmt.Errorf("%w: uploaded code %s expired before it was loaded; send it again", codesource.ErrInvalid, in.Ref.SHA256)
			}
		}
	default:
		err = fmt.Errorf("%w: unknown source kind %q", codesource.ErrInvalid, in.Ref.SourceKind)
	}
	if cerr := createAllowed(); cerr != nil {
		return catalog.CodeRef{}, cerr
	}
	if err != nil {
		return catalog.CodeRef{}, classify(err)
	}
	// A rollback's code is a version of the worker's history, stored under
	// its SHA-256 and named by that history: the sweep keeps it
	// (catalog/codegc.go), so it is checked and not stored again.
	rollback := in.Ref.RollbackTo > 0
	if !rollback {
		// The orphan index is read beside the check
		// (ReadAheadForPutCode); the body is stored only once the check
		// passed.
		ctx = a.Catalog.ReadAheadForPutCode(ctx, catalog.SHA256(body))
	}
	if err := a.Node.Check(ctx, in.Worker, body); err != nil {
		err = classify(a.onNode(err))
		if in.Ref.SourceKind == "content" && !rollback && failure.Kind(err) == failure.InvalidArgument {
			_ = a.Catalog.DeleteStaged(ctx, in.Ref.SHA256)
		}
		return catalog.CodeRef{}, err
	}
	if rollback {
		return in.Ref, nil
	}
	sha, err := a.Catalog.PutCode(ctx, body)
	if err != nil {
		return catalog.CodeRef{}, err
	}
	// An unpinned URL (CODE_URL_ALLOW_UNPINNED) is pinned now: the version
	// is what was fetched, stored under its SHA-256.
	in.Ref.SHA256 = sha
	if in.Ref.SourceKind == "content" {
		// The staged copy is not needed any more: it is dropped after the
		// answer, not before it (a retry of this activity finds the body
		// in the code store, and a copy whose delete fails expires after
		// catalog.StagingTTL).
		a.dropStaged(ctx, sha)
	}
	return in.Ref, nil
}

// dropStaged deletes the staged copy of sha in the background, bounded by
// dropStagedTimeout. Nothing waits for it: a node that stops meanwhile
// leaves the copy to expire.
func (a *Activities) dropStaged(ctx context.Context, sha string) {
	go func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dropStagedTimeout)
		defer cancel()
		_ = a.Catalog.DeleteStaged(ctx, sha)
	}()
}

// dropStagedTimeout bounds a staged copy's delete.
const dropStagedTimeout = 10 * time.Second

// startCreateChecks starts the reads that say whether a create of worker
// id may go on — it has no record (one whose workflow was lost is being
// recovered, never created over) and no tombstone (a deleted worker's id
// is not used again, issue 43 item 13) — and returns the function that
// waits for them and answers (AlreadyExists, or the store's error). It
// may be called more than once.
func (a *Activities) startCreateChecks(ctx context.Context, id string) func() error {
	var existsErr, deletedErr error
	var deleted bool
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		_, existsErr = a.Catalog.GetWorker(ctx, id)
	}()
	go func() {
		defer wg.Done()
		deleted, deletedErr = a.Catalog.Deleted(ctx, id)
	}()
	return func() error {
		wg.Wait()
		switch {
		case existsErr == nil:
			return failure.New(failure.AlreadyExists,
				fmt.Sprintf("worker %s already exists in the catalog (its workflow is being recovered)", id))
		case !errors.Is(existsErr, catalog.ErrNotFound):
			return existsErr
		case deletedErr != nil:
			return deletedErr
		case deleted:
			return failure.New(failure.AlreadyExists,
				fmt.Sprintf("worker %s was deleted; its id (its name, its request id) is not used again", id))
		}
		return nil
	}
}

// EventSpec is one lifecycle event to publish; ID is deterministic so that a
// retried activity republishes the same event.
type EventSpec struct {
	ID   string
	Kind lifecycleevents.Kind
	// ErrorType and ErrorMessage describe an error event.
	ErrorType    string `json:",omitempty"`
	ErrorMessage string `json:",omitempty"`
}

// ApplyInput is a worker's new state.
type ApplyInput struct {
	Worker  catalog.Worker
	History *catalog.HistoryEntry
}

// Applied is what Apply and Delete answer: the node that made the change
// and, having made it, already matches the record as an Activate there
// would leave it. The fan-out that follows (workflows.syncNodes) need not
// ask that node again. Empty when the node has no id (no membership).
type Applied struct {
	Node string `json:"node,omitempty"`
}

// applied names this node, which made a change.
func (a *Activities) applied() Applied {
	if self, ok := a.Members.(interface{ Self() string }); ok {
		return Applied{Node: self.Self()}
	}
	return Applied{}
}

// Apply makes this node serve the worker as described (attach, hot-swap code
// or detach), then persists the record (and history entry). The node goes
// first so that a worker whose code cannot be attached is never persisted.
// Its lifecycle events are published by Emit, once every node applied it.
// It heartbeats while it works (workflows.ApplyHeartbeat), as Activate.
// It answers with this node's id (Applied).
func (a *Activities) Apply(ctx context.Context, in ApplyInput) (Applied, error) {
	if err := a.apply(ctx, in); err != nil {
		return Applied{}, err
	}
	return a.applied(), nil
}

func (a *Activities) apply(ctx context.Context, in ApplyInput) error {
	defer heartbeatWhileRunning(ctx)()
	// The history keys the change writes after the node's load are read
	// now, beside the placement, the record's check and the load
	// (catalog.ReadAheadForApply).
	ctx = a.Catalog.ReadAheadForApply(ctx, in.Worker, in.History)
	if err := a.ensurePlaced(ctx, in.Worker); err != nil {
		return classify(a.onNode(fmt.Errorf("place topic %s: %w", in.Worker.Topic, err)))
	}
	h := in.History
	if h != nil && h.Action == catalog.HistoryCreate && (in.Worker.MaxConcurrency != 0 || in.Worker.MaxProcesses != 0 || in.Worker.TimeoutMS != 0) {
		// The create's entry records the worker's concurrency bounds and
		// timeout, as its placement (set here, not by the workflow: no
		// change to it).
		c := *h
		c.MaxConcurrency, c.MaxProcesses, c.TimeoutMS = in.Worker.MaxConcurrency, in.Worker.MaxProcesses, in.Worker.TimeoutMS
		h = &c
	}
	return classify(a.onNode(a.Node.Apply(ctx, in.Worker, h)))
}

// onNode names this node in err (nil stays nil): a load check or a load
// that fails on one node may pass on another (a package missing there),
// and the caller's answer says where it failed (issue 43 item 13).
func (a *Activities) onNode(err error) error {
	self, ok := a.Members.(interface{ Self() string })
	if err == nil || !ok {
		return err
	}
	return fmt.Errorf("node %s: %w", self.Self(), err)
}

// DeleteInput names the worker to delete.
type DeleteInput struct {
	Worker catalog.Worker
}

// Delete detaches the worker and removes its config and history. Its code
// blobs become candidates for collection first (catalog.RemoveWorker
// marks them before it removes anything), so that a retry after a removal
// cut off half-way (its history gone) does not leave them stored for
// ever. Its deleted event is published by Emit, once every node applied
// the delete. It answers with this node's id (Applied).
func (a *Activities) Delete(ctx context.Context, in DeleteInput) (Applied, error) {
	if err := a.Node.Remove(ctx, in.Worker); err != nil {
		return Applied{}, classify(err)
	}
	if err := a.Catalog.ClearNotRecovered(ctx, in.Worker.ID); err != nil {
		return Applied{}, err
	}
	return a.applied(), nil
}

// EmitInput names lifecycle events of a worker.
type EmitInput struct {
	Worker catalog.Worker
	Events []EventSpec
}

// Emit publishes lifecycle events; their ids are deterministic, so a retry
// publishes duplicates that consumers can drop. Two events also leave a
// note in the catalog first (recorded here, where the workflows already
// report them, so no workflow changes): "deleted" marks the worker's
// tombstone as a deleted worker's (catalog.MarkDeleted: its id is not
// created again), and recovery's "not_recovered" error records the reason
// GetWorker gives (catalog.SetNotRecovered; best effort, as the event is).
func (a *Activities) Emit(ctx context.Context, in EmitInput) error {
	for _, e := range in.Events {
		switch {
		case e.Kind == lifecycleevents.Deleted:
			if err := a.Catalog.MarkDeleted(ctx, in.Worker.ID); err != nil {
				return err
			}
		case e.Kind == lifecycleevents.Error && e.ErrorType == NotRecoveredType:
			if err := a.Catalog.SetNotRecovered(ctx, in.Worker.ID, NotRecoveredReason(in.Worker.ID, e.ErrorMessage), time.Now()); err != nil && activity.IsActivity(ctx) {
				activity.GetLogger(ctx).Warn("why the worker was not recovered is not recorded", "worker_id", in.Worker.ID, "err", err)
			}
		}
	}
	return a.emit(ctx, in.Worker, in.Events)
}

// NotRecoveredType is the error_type of the error event of a worker that
// recovery could not bring back (workflows.RecoveryFailedType).
const NotRecoveredType = "not_recovered"

// NotRecoveredMessage is the text of that event: why, and what happens
// next.
func NotRecoveredMessage(id string, cause error) string {
	return fmt.Sprintf("worker %s was not recovered: %v%s", id, cause, notRecoveredNext)
}

const notRecoveredNext = "; nodes try it again at their next reconcile (or repeat an operation on it)"

// NotRecoveredReason is the cause in a NotRecoveredMessage (msg as it is
// when it is not one), without the frame Temporal puts around an
// activity's error ("activity error (type: Activate, …): <error> (type:
// …, retryable: …)").
func NotRecoveredReason(id, msg string) string {
	r := strings.TrimSuffix(strings.TrimPrefix(msg, fmt.Sprintf("worker %s was not recovered: ", id)), notRecoveredNext)
	if m := temporalFrame.FindStringSubmatch(r); m != nil {
		r = m[1]
	}
	return r
}

var temporalFrame = regexp.MustCompile(`(?s)^activity error \(type: [^)]*\): (.*?)(?: \(type: [^,()]*, retryable: (?:true|false)\))?$`)

// ListWorkerIDsPage returns the ids on one page of the worker index
// (recoveries recorded before ListWorkerIDsChunk take the pages one by
// one).
func (a *Activities) ListWorkerIDsPage(ctx context.Context, page int) ([]string, error) {
	return a.Catalog.WorkerIDsPage(ctx, page)
}

// ListWorkerIDsChunk returns the ids of one chunk of the worker index, at
// most catalog.IndexChunkBytes of them whatever the number of workers, and
// the cursor of the next chunk (recovery takes the index chunk by chunk).
func (a *Activities) ListWorkerIDsChunk(ctx context.Context, cur catalog.IndexCursor) (catalog.IndexChunk, error) {
	return a.Catalog.WorkerIDsChunk(ctx, cur, catalog.IndexChunkBytes)
}

// ListWorkerIDs returns the ids of every persisted worker (the recovery of
// histories recorded before the paged index replays it).
func (a *Activities) ListWorkerIDs(ctx context.Context) ([]string, error) {
	return a.Catalog.WorkerIDs(ctx)
}

// GetWorkers returns the persisted records of ids, leaving out deleted ones
// (recovery, one batch at a time).
func (a *Activities) GetWorkers(ctx context.Context, ids []string) ([]catalog.Worker, error) {
	return a.Catalog.GetWorkers(ctx, ids)
}

// ListNodes returns the ids of the live nodes, each polling its own task
// queue (workflows.NodeTaskQueue).
func (a *Activities) ListNodes(ctx context.Context) ([]string, error) {
	if a.Members == nil {
		return nil, nil
	}
	return a.Members.Alive(ctx)
}

// Activate makes this node match a persisted worker (recovery, and on every
// node after each lifecycle change). It re-reads the record so that a change
// made since the list was taken wins. It heartbeats while it works
// (workflows.ActivateHeartbeat): a node that stops running it (paused,
// frozen, cut off after it picked the task up) is noticed within the
// heartbeat timeout instead of the whole ActivateTimeout.
func (a *Activities) Activate(ctx context.Context, id string) error {
	defer heartbeatWhileRunning(ctx)()
	if err := a.refreshPlacement(ctx); err != nil {
		return classify(fmt.Errorf("read the placement: %w", err))
	}
	return classify(a.Node.Sync(ctx, id))
}

// heartbeatInterval is how often heartbeatWhileRunning records a heartbeat
// (the SDK sends them to the server at most every 80 % of the timeout).
const heartbeatInterval = 2 * time.Second

// heartbeatWhileRunning records the activity's heartbeat every
// heartbeatInterval until the returned stop is called; outside an activity
// (unit tests) it does nothing.
func heartbeatWhileRunning(ctx context.Context) (stop func()) {
	if !activity.IsActivity(ctx) {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(heartbeatInterval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				activity.RecordHeartbeat(ctx)
			}
		}
	}()
	return func() { close(done) }
}

func (a *Activities) emit(ctx context.Context, w catalog.Worker, events []EventSpec) error {
	for _, e := range events {
		d := lifecycleevents.Data{WorkerID: w.ID, WorkerName: w.Name, Group: w.Group, Topic: w.Topic, CodeVersion: w.CodeVersion,
			ErrorType: e.ErrorType, ErrorMessage: e.ErrorMessage}
		if err := a.Events.Emit(ctx, e.ID, e.Kind, d); err != nil {
			return err
		}
	}
	return nil
}

// classify turns errors caused by the request into non-retryable
// InvalidArgument (or, for a refused code source, PermissionDenied)
// application errors; everything else stays retryable.
// Its text is cut to maxFailureText: a failure is stored in the
// workflow's history and sent to the caller, and a worker's error (an
// import error, a compiler's output) may be of any size.
func classify(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, catalog.ErrStale) {
		// A late attempt of a change the catalog has moved past: trying it
		// again never succeeds.
		return temporal.NewNonRetryableApplicationError(cutText(err.Error(), maxFailureText), StaleWrite, nil)
	}
	if errors.Is(err, codesource.ErrForbidden) {
		return failure.New(failure.PermissionDenied, cutText(err.Error(), maxFailureText))
	}
	for _, bad := range []error{engines.ErrInvalidCode, engines.ErrUnknownMIMEType, codesource.ErrInvalid, catalog.ErrInvalidSpec} {
		if errors.Is(err, bad) {
			return failure.New(failure.InvalidArgument, cutText(err.Error(), maxFailureText))
		}
	}
	if len(err.Error()) > maxFailureText {
		return &cutError{text: cutText(err.Error(), maxFailureText), err: err}
	}
	return err
}

// StaleWrite is the application error type (non-retryable) of a change
// that the catalog has moved past (catalog.ErrStale).
const StaleWrite = "StaleWrite"

// maxFailureText bounds the text of an activity's error.
const maxFailureText = 16 << 10

// cutText is s cut to at most n bytes (not inside a UTF-8 sequence),
// ending in "..." when it was cut; it does not share s's memory then.
func cutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	n -= 3
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

// cutError is an error whose text was cut. errors.Is still sees the error
// it was cut from, but it has no Unwrap: Temporal's failure converter
// would add that error, whole, as the failure's cause.
type cutError struct {
	text string
	err  error
}

func (e *cutError) Error() string        { return e.text }
func (e *cutError) Is(target error) bool { return errors.Is(e.err, target) }
