// Package infraevents owns WorkManager's infrastructure events: CloudEvents
// about the cluster rather than about one worker, on topics under
// "workmanager.infra." — group-lock changes (acquired, released, stolen,
// theft aborted, contended) and node heartbeats. They are published off the
// hot path through a bounded queue: when the broker is slower than the
// events, the oldest-first queue drops new events and counts them instead of
// slowing message processing down.
package infraevents

import (
	"context"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/internal/publish"
)

// TopicPrefix starts every infrastructure topic; worker topics may not.
const TopicPrefix = "workmanager.infra."

const (
	// GroupLockTopic carries group-lock changes.
	GroupLockTopic = TopicPrefix + "grouplock"
	// HeartbeatTopic carries node heartbeats.
	HeartbeatTopic = TopicPrefix + "heartbeat"
)

// MaxLen caps each infrastructure topic's stream (about this many events
// are kept): they are read live, and nothing may grow without bound.
const MaxLen = 10000

// TypePrefix prefixes every infrastructure event type.
const TypePrefix = "com.virtufin.workmanager.infra."

// Emitter publishes infrastructure events in the background.
type Emitter struct {
	log     *slog.Logger
	pub     publish.Publisher
	node    string
	queue   chan pending
	seq     atomic.Int64
	dropped atomic.Int64
}

type pending struct {
	topic string
	ev    event.Event
}

// NewEmitter publishes through pub as node, queueing at most depth events.
func NewEmitter(log *slog.Logger, pub publish.Publisher, node string, depth int) *Emitter {
	if depth <= 0 {
		depth = 1024
	}
	return &Emitter{log: log, pub: pub, node: node, queue: make(chan pending, depth)}
}

// Emit queues one event of kind ("grouplock.acquired", "heartbeat", ...)
// on topic with data (JSON). It never blocks.
func (e *Emitter) Emit(topic, kind string, data any) {
	ev := event.New(event.CloudEventsVersionV1)
	ev.SetID(e.node + "/" + strconv.FormatInt(time.Now().UnixNano(), 36) + "/" + strconv.FormatInt(e.seq.Add(1), 36))
	ev.SetSource("workmanager/nodes/" + e.node)
	ev.SetType(TypePrefix + kind)
	ev.SetTime(time.Now().UTC())
	_ = ev.SetData(event.ApplicationJSON, data)
	select {
	case e.queue <- pending{topic, ev}:
	default:
		if e.dropped.Add(1)%100 == 1 {
			e.log.Warn("infrastructure events dropped: the broker is slower than they are produced", "dropped", e.dropped.Load())
		}
	}
}

// Dropped counts events dropped because the queue was full.
func (e *Emitter) Dropped() int64 { return e.dropped.Load() }

// Run publishes queued events until ctx ends.
func (e *Emitter) Run(ctx context.Context) {
	for {
		select {
		case p := <-e.queue:
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if err := e.pub.Publish(pctx, p.topic, &p.ev); err != nil {
				e.log.Debug("infrastructure event not published", "topic", p.topic, "err", err)
			}
			cancel()
		case <-ctx.Done():
			return
		}
	}
}
