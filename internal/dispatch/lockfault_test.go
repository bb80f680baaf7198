package dispatch_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/dispatch/dispatchtest"
	"github.com/virtufin/workmanager/internal/grouplock"
	"github.com/virtufin/workmanager/internal/publish/publishtest"
	"github.com/virtufin/workmanager/internal/state"
)

// lockKeysDown fails every read of a group lock while down is set (the
// state store flapping under the lock).
type lockKeysDown struct {
	state.Store
	down atomic.Bool
}

func (s *lockKeysDown) Get(ctx context.Context, key string) (state.Item, error) {
	if s.down.Load() && strings.HasPrefix(key, grouplock.Key("")) {
		return state.Item{}, errors.New("state store unavailable")
	}
	return s.Store.Get(ctx, key)
}

// Issue 43, item 13 (confirmed): a store error on the group lock is not the
// worker's failure. It counted as an attempt, so a flapping store
// dead-lettered grouped messages (lock_error) that never ran. Now the
// message is given back without spending an attempt and runs once the
// store answers.
func TestLockStoreErrorsAreNotAttempts(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	st := &lockKeysDown{Store: state.NewMemoryStore()}
	d := newTestDispatcherWith(t, b, pub, st, dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1, MaxAttempts: 2})
	var calls atomic.Int32
	d.Attach(dispatch.Worker{ID: "w", Topic: "in", Group: "g"}, &dispatchtest.FuncInstance{Fn: func(in *event.Event) ([]event.Event, error) {
		calls.Add(1)
		return outputs("out")(in)
	}})
	s := waitStream(t, b, "in")
	st.down.Store(true)
	for i := range 4 { // twice MaxAttempts deliveries while the lock cannot be read
		s.In <- request("m", "")
		if a := waitAck(t, b); a.Status != dispatch.AckRetry {
			t.Fatalf("delivery %d with the lock store down: ack %+v, want RETRY", i+1, a)
		}
	}
	if n := len(pub.On("in" + dispatch.DeadLetterSuffix)); n != 0 || calls.Load() != 0 {
		t.Fatalf("with the lock store down: %d dead letters, %d calls; want none", n, calls.Load())
	}
	st.down.Store(false)
	s.In <- request("m", "")
	if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
		t.Fatalf("ack %+v once the store answers, want SUCCESS", a)
	}
	if calls.Load() != 1 || len(pub.On("out")) != 1 || len(pub.On("in"+dispatch.DeadLetterSuffix)) != 0 {
		t.Fatalf("%d calls, %d outputs, %d dead letters; want 1, 1, 0", calls.Load(), len(pub.On("out")), len(pub.On("in"+dispatch.DeadLetterSuffix)))
	}
}
