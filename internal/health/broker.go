package health

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Broker is the name of the broker check: Degraded while publishing through
// the broker fails on this node (the last publish, real or probe, failed) or
// while a topic's subscription cannot be opened or was lost.
const Broker = "broker"

// BrokerWatch turns the outcomes of publishes and subscriptions into the
// broker check. Real traffic reports through Published and Subscribed; Probe
// publishes on a timer so that an idle node notices a broker that went away.
// It is safe for concurrent use.
type BrokerWatch struct {
	state *State

	// publishing is true while the last publish succeeded: a successful
	// publish then changes nothing and returns without the lock (every
	// worker output reports here).
	publishing atomic.Bool

	mu      sync.Mutex
	probed  bool             // a publish outcome has been seen
	pubErr  error            // the last publish's error; nil when it succeeded
	subErrs map[string]error // failing subscriptions by topic
}

// NewBrokerWatch reports into s, Degraded until the first publish outcome.
func NewBrokerWatch(s *State) *BrokerWatch {
	b := &BrokerWatch{state: s, subErrs: map[string]error{}}
	b.update()
	return b
}

// Published records the outcome of one publish. A cancelled publish (node
// shutting down, caller gone) says nothing about the broker and is ignored.
func (b *BrokerWatch) Published(err error) {
	if (err == nil && b.publishing.Load()) || errors.Is(err, context.Canceled) {
		return
	}
	b.mu.Lock()
	b.probed, b.pubErr = true, err
	b.publishing.Store(err == nil)
	b.mu.Unlock()
	b.update()
}

// Subscribed records the state of topic's subscription: err is why it could
// not be opened or was lost; nil means it is open, or no longer wanted.
func (b *BrokerWatch) Subscribed(topic string, err error) {
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	b.mu.Lock()
	_, failing := b.subErrs[topic]
	if err != nil {
		b.subErrs[topic] = err
	} else {
		delete(b.subErrs, topic)
	}
	b.mu.Unlock()
	if failing || err != nil {
		b.update()
	}
}

// Probe calls probe (a publish) at once and then every interval until ctx
// ends, each call bounded by timeout, and records its outcome.
func (b *BrokerWatch) Probe(ctx context.Context, interval, timeout time.Duration, probe func(context.Context) error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, timeout)
		err := probe(pctx)
		timedOut := errors.Is(pctx.Err(), context.DeadlineExceeded)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil && timedOut {
			err = fmt.Errorf("no answer within %s: %w", timeout, err)
		}
		b.Published(err)
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

func (b *BrokerWatch) update() {
	b.mu.Lock()
	var problems []string
	if !b.probed {
		problems = append(problems, "no publish has completed yet")
	}
	if b.pubErr != nil {
		problems = append(problems, "publish failing: "+clip(b.pubErr.Error()))
	}
	if n := len(b.subErrs); n > 0 {
		topics := make([]string, 0, n)
		for t := range b.subErrs {
			topics = append(topics, t)
		}
		sort.Strings(topics)
		problems = append(problems, fmt.Sprintf("subscription failing on %d topic(s), first %q: %s", n, topics[0], clip(b.subErrs[topics[0]].Error())))
	}
	b.mu.Unlock()
	if len(problems) > 0 {
		b.state.Set(Broker, Degraded, strings.Join(problems, "; "))
		return
	}
	b.state.Set(Broker, Healthy, "publishing and subscribing work")
}

func clip(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}
