// Package lifecycleevents owns WorkManager's lifecycle events (the
// lifecycle itself is workflows/): CloudEvents v1.0 on
// the topic "workmanager.lifecycle" with type
// "com.virtufin.workmanager.lifecycle.<state>", published for every worker
// transition and for every worker error on the hot path.
package lifecycleevents

import (
	"context"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/google/uuid"

	"github.com/virtufin/workmanager/internal/publish"
	"github.com/virtufin/workmanager/internal/tenant"
)

// Topic carries every lifecycle event.
const Topic = "workmanager.lifecycle"

// TypePrefix prefixes every lifecycle event type.
const TypePrefix = "com.virtufin.workmanager.lifecycle."

// Source is the CloudEvent source of lifecycle events.
const Source = "workmanager"

// Kind is the state a lifecycle event reports.
type Kind string

const (
	Created     Kind = "created"
	Started     Kind = "started"
	Stopped     Kind = "stopped"
	Deleted     Kind = "deleted"
	CodeUpdated Kind = "code_updated"
	Error       Kind = "error"
	// DeadLettered: a worker gave up on a message after its attempts; the
	// message is on "<topic>-dead".
	DeadLettered Kind = "dead_lettered"
)

// Data is the payload of a lifecycle event.
type Data struct {
	WorkerID string `json:"worker_id"`
	// WorkerName is the worker's unique name, when it has one.
	WorkerName   string `json:"worker_name,omitempty"`
	Tenant       string `json:"tenant,omitempty"`
	Group        string `json:"group"`
	Topic        string `json:"topic"`
	CodeVersion  int64  `json:"code_version,omitempty"`
	ErrorType    string `json:"error_type,omitempty"`
	ErrorMessage string `json:"error_message,omitempty"`
	// Traceback is where a hot-path error happened, when the engine knows
	// (the Python traceback, the .NET stack, a native worker's error
	// text): bounded (16 KiB, its end kept) and redacted like
	// ErrorMessage.
	Traceback string `json:"traceback,omitempty"`
	// EventID, Attempt and MaxAttempts locate a hot-path error or dead
	// letter: the input event and which attempt of how many it was.
	EventID     string `json:"event_id,omitempty"`
	Attempt     int    `json:"attempt,omitempty"`
	MaxAttempts int    `json:"max_attempts,omitempty"`
	// Reason is why a message was dead-lettered (dead_lettered events).
	Reason string `json:"reason,omitempty"`
}

// Emitter publishes lifecycle events.
type Emitter struct {
	pub publish.Publisher
}

// NewEmitter publishes through pub.
func NewEmitter(pub publish.Publisher) *Emitter { return &Emitter{pub: pub} }

// Emit publishes one lifecycle event. id, when non-empty, makes the event id
// deterministic so that a retried activity does not produce a new event id.
func (e *Emitter) Emit(ctx context.Context, id string, kind Kind, d Data) error {
	ev := New(id, kind, d)
	return e.pub.Publish(ctx, Topic, &ev)
}

// New builds a lifecycle event.
func New(id string, kind Kind, d Data) event.Event {
	if id == "" {
		id = uuid.NewString()
	}
	ev := event.New(event.CloudEventsVersionV1)
	ev.SetID(id)
	ev.SetSource(Source)
	ev.SetType(TypePrefix + string(kind))
	ev.SetTime(time.Now().UTC())
	ev.SetSubject(d.WorkerID)
	if d.Tenant == "" && d.WorkerID != "" {
		d.Tenant = tenant.Of(d.WorkerID) // the worker id carries its tenant
	}
	if d.Tenant != "" {
		// As an extension too, so that subscribers can filter by tenant.
		ev.SetExtension("tenant", d.Tenant)
	}
	_ = ev.SetData(event.ApplicationJSON, d)
	return ev
}
