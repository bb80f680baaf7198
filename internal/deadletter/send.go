package deadletter

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/publish"
)

// Reason says why a message was given up on: the deadletterreason
// extension of its dead letter, its Entry's Reason and the reason of its
// worker.dead_lettered event (and, for a failed attempt, the error_type of
// its worker.error event).
type Reason string

// The reasons. Each is documented in docs/architecture.md ("Dead letters").
const (
	ReasonWorkerFailed   Reason = "worker_failed"
	ReasonTimeout        Reason = "timeout"
	ReasonLockContention Reason = "lock_contention"
	ReasonLockError      Reason = "lock_error"
	ReasonStaleLock      Reason = "stale_lock"
	ReasonPublishFailed  Reason = "publish_failed"
	ReasonPanic          Reason = "panic"
	ReasonInternal       Reason = "internal"
	ReasonUndecodable    Reason = "undecodable"
	ReasonTooLarge       Reason = "too_large"
	ReasonNotRunnable    Reason = "not_runnable"
	ReasonNotRunning     Reason = "not_running" // a replay for a worker stopped or deleted since
	ReasonOutputPolicy   Reason = "output_policy"
	ReasonOutputLimit    Reason = "output_limit"
	ReasonOutputInvalid  Reason = "output_invalid"
	// ReasonCrashed: the event was in flight in the worker at crashes of
	// the node (its crash journal); it is not run again.
	ReasonCrashed Reason = "crashed"
)

// RetryCannotFix reports whether a failure of this reason comes back on
// every retry of the same input, so that retrying only delays the dead
// letter: outputs the worker's policy refuses (a reserved topic, its own
// input topic, one outside allowed_output_topics), outputs over the node's
// limits and outputs that cannot be published at all. Such a failure is
// dead-lettered on its first attempt.
func (r Reason) RetryCannotFix() bool {
	return r == ReasonOutputPolicy || r == ReasonOutputLimit || r == ReasonOutputInvalid
}

// TopicSuffix names a topic's dead-letter topic: "<topic>-dead".
const TopicSuffix = "-dead"

// Extensions a dead letter carries on "<topic>-dead", beside the original
// event's own.
const (
	ReasonExtension   = "deadletterreason"
	AttemptsExtension = "deadletterattempts"
	ErrorExtension    = "deadlettererror"
	WorkerExtension   = "deadletterworker"
	// TruncatedExtension, on a too_large dead letter, is the size of the
	// event's data, of which only the first MAX_EVENT_BYTES are carried.
	TruncatedExtension = "deadlettertruncated"
	// ContentTypeExtension keeps the content type an undecodable message
	// came with (its data is carried as application/octet-stream).
	ContentTypeExtension = "deadlettercontenttype"
)

// Letter is one message given up on.
type Letter struct {
	// Topic is the topic the message came from (not the -dead one).
	Topic string
	// Worker is who gave up on it; zero for a message no worker could take
	// (undecodable, too large: a raw letter).
	Worker lifecycleevents.Data
	Reason Reason
	// Attempts made, and the worker's limit (for its event).
	Attempts, MaxAttempts int
	// Error and Traceback are the last error and where it happened, as
	// they may leave the node (redacted and bounded by the caller).
	Error, Traceback string
	// Event is the message. A worker's letter: the input as the worker
	// saw it first (stored whole for ReplayDeadLetters). A raw letter: the
	// event the node built around the bytes as they came.
	Event *event.Event
	// EventID and Source identify the message in the store.
	EventID, Source string
	// Raw, for a raw letter, are the bytes stored for a replay (nil: not
	// stored, e.g. too large).
	Raw []byte
}

// Sender stores, publishes and announces dead letters.
type Sender struct {
	Store  *Store
	Pub    publish.Publisher
	Events *lifecycleevents.Emitter // worker.dead_lettered (nil: none)
	Log    *slog.Logger
}

// Send stores l first (whoever sees it on "<topic>-dead" can list and
// replay it; Add is idempotent, one entry per owner and event, so a Send
// that fails and is redone on the redelivery leaves one entry), then
// publishes the event with the dead-letter extensions to "<topic>-dead",
// then announces a worker's letter as worker.dead_lettered. An error means
// it was not published: the message must come back.
func (s *Sender) Send(ctx context.Context, l Letter) error {
	entry := Entry{Worker: l.Worker.WorkerID, Topic: l.Topic, Reason: string(l.Reason), Attempts: l.Attempts, Error: l.Error,
		Traceback: l.Traceback, EventID: l.EventID, Source: l.Source, Raw: l.Raw, AtMS: time.Now().UnixMilli()}
	var ev event.Event
	if l.Worker.WorkerID != "" {
		original, err := l.Event.MarshalJSON()
		if err != nil {
			return fmt.Errorf("encode dead letter: %w", err)
		}
		entry.Event = json.RawMessage(original)
		ev = l.Event.Clone()
		ev.SetExtension(WorkerExtension, l.Worker.WorkerID)
	} else {
		ev = *l.Event
	}
	ev.SetExtension(ReasonExtension, string(l.Reason))
	ev.SetExtension(AttemptsExtension, int32(l.Attempts))
	ev.SetExtension(ErrorExtension, l.Error)
	if err := s.Store.Add(ctx, entry); err != nil {
		return err
	}
	if err := s.Pub.Publish(ctx, l.Topic+TopicSuffix, &ev); err != nil {
		return err
	}
	if s.Events != nil && l.Worker.WorkerID != "" {
		data := l.Worker
		data.EventID, data.Reason, data.Attempt, data.MaxAttempts = l.EventID, string(l.Reason), l.Attempts, l.MaxAttempts
		data.ErrorMessage, data.Traceback = l.Error, l.Traceback
		if err := s.Events.Emit(ctx, "", lifecycleevents.DeadLettered, data); err != nil && s.Log != nil {
			s.Log.Warn("publishing worker.dead_lettered failed", "worker_id", l.Worker.WorkerID, "err", err)
		}
	}
	return nil
}
