package dispatch

import (
	"context"
	"fmt"
	"sync"
	"time"

	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"
)

// Ack is the answer given to the broker for one message.
type Ack = runtimev1.TopicEventResponse_TopicEventResponseStatus

const (
	AckSuccess = runtimev1.TopicEventResponse_SUCCESS
	AckRetry   = runtimev1.TopicEventResponse_RETRY
)

// Stream is one open subscription to a topic.
type Stream interface {
	// Recv blocks for the next message; an error ends the stream.
	Recv() (*runtimev1.TopicEventRequest, error)
	// Ack answers one message. It is safe for concurrent use.
	Ack(id string, status Ack) error
	// Close ends the subscription.
	Close()
}

// Subscriber opens streams.
type Subscriber interface {
	Subscribe(ctx context.Context, pubsub, topic string) (Stream, error)
}

// DaprSubscriber opens Dapr streaming subscriptions (SubscribeTopicEventsAlpha1)
// on the raw runtime proto client: go-sdk v1.11's TopicEvent drops CloudEvent
// extensions such as correlationid, and its stream does not reconnect.
type DaprSubscriber struct {
	Client runtimev1.DaprClient
}

// SubscribeTimeout bounds how long daprd may take to confirm a subscription.
const SubscribeTimeout = 10 * time.Second

// Subscribe implements Subscriber. It returns once daprd has confirmed the
// subscription (its initial response), so that a broker that refuses it
// (down, connection pool exhausted) is an error here, not a silent stream.
func (s DaprSubscriber) Subscribe(ctx context.Context, pubsub, topic string) (Stream, error) {
	ctx, cancel := context.WithCancel(ctx)
	st, err := s.Client.SubscribeTopicEventsAlpha1(ctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("subscribe %s/%s: %w", pubsub, topic, err)
	}
	err = st.Send(&runtimev1.SubscribeTopicEventsRequestAlpha1{
		SubscribeTopicEventsRequestType: &runtimev1.SubscribeTopicEventsRequestAlpha1_InitialRequest{
			InitialRequest: &runtimev1.SubscribeTopicEventsRequestInitialAlpha1{PubsubName: pubsub, Topic: topic},
		},
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("subscribe %s/%s: %w", pubsub, topic, err)
	}
	timer := time.AfterFunc(SubscribeTimeout, cancel)
	first, err := st.Recv()
	if !timer.Stop() {
		err = fmt.Errorf("no confirmation within %s", SubscribeTimeout)
	}
	if err != nil {
		cancel()
		return nil, fmt.Errorf("subscribe %s/%s: %w", pubsub, topic, err)
	}
	d := &daprStream{st: st, cancel: cancel}
	if m := first.GetEventMessage(); m != nil { // no initial response: keep the event
		d.first = m
	}
	return d, nil
}

type daprStream struct {
	st     runtimev1.Dapr_SubscribeTopicEventsAlpha1Client
	cancel context.CancelFunc
	sendMu sync.Mutex
	first  *runtimev1.TopicEventRequest // received while confirming
}

func (d *daprStream) Recv() (*runtimev1.TopicEventRequest, error) {
	if m := d.first; m != nil {
		d.first = nil
		return m, nil
	}
	for {
		resp, err := d.st.Recv()
		if err != nil {
			return nil, err
		}
		if m := resp.GetEventMessage(); m != nil {
			return m, nil
		}
		// The initial response carries nothing we need.
	}
}

func (d *daprStream) Ack(id string, status Ack) error {
	d.sendMu.Lock()
	defer d.sendMu.Unlock()
	return d.st.Send(&runtimev1.SubscribeTopicEventsRequestAlpha1{
		SubscribeTopicEventsRequestType: &runtimev1.SubscribeTopicEventsRequestAlpha1_EventProcessed{
			EventProcessed: &runtimev1.SubscribeTopicEventsRequestProcessedAlpha1{
				Id: id, Status: &runtimev1.TopicEventResponse{Status: status},
			},
		},
	})
}

func (d *daprStream) Close() {
	d.sendMu.Lock()
	_ = d.st.CloseSend()
	d.sendMu.Unlock()
	d.cancel()
}

// topicLoop keeps one subscription open until ctx ends, reconnecting with
// backoff when daprd goes away.
func (d *Dispatcher) topicLoop(ctx context.Context, t *topic) {
	defer close(t.done)
	defer d.cfg.OnSubscription(t.name, nil) // no longer wanted
	log := d.log.With("topic", t.name)
	backoff := d.cfg.ReconnectMin
	for ctx.Err() == nil {
		st, err := d.Sub.Subscribe(ctx, d.cfg.PubSub, t.name)
		if err == nil {
			log.Debug("subscribed")
			t.subscribed.Store(true)
			d.cfg.OnSubscription(t.name, nil)
			stopClose := context.AfterFunc(ctx, st.Close) // unblock Recv on unsubscribe
			var got bool
			for {
				req, err2 := st.Recv()
				if err2 != nil {
					err = err2
					break
				}
				got = true
				d.receive(t, st, req)
			}
			t.subscribed.Store(false)
			stopClose()
			st.Close()
			if got {
				backoff = d.cfg.ReconnectMin
			}
		}
		if ctx.Err() != nil {
			return
		}
		d.cfg.OnSubscription(t.name, err)
		t.m.Reconnects.Inc()
		log.Warn("subscription lost, reconnecting", "err", err, "backoff", backoff)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return
		}
		backoff = min(2*backoff, d.cfg.ReconnectMax)
	}
}
