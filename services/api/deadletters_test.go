package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/mocks"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/delivery"
	"github.com/virtufin/workmanager/internal/publish/publishtest"
	"github.com/virtufin/workmanager/internal/state"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
	"github.com/virtufin/workmanager/workflows"
)

const (
	w1 = "11111111-1111-4111-8111-111111111111"
	w2 = "22222222-2222-4222-8222-222222222222"
	w3 = "33333333-3333-4333-8333-333333333333"
)

// failingStore fails the operations fail picks.
type failingStore struct {
	state.Store
	fail func(op, key string) error
}

func (f *failingStore) Delete(ctx context.Context, key, etag string) error {
	if f.fail != nil {
		if err := f.fail("delete", key); err != nil {
			return err
		}
	}
	return f.Store.Delete(ctx, key, etag)
}

func (f *failingStore) Put(ctx context.Context, key string, v []byte, o state.PutOptions) error {
	if f.fail != nil {
		if err := f.fail("put", key); err != nil {
			return err
		}
	}
	return f.Store.Put(ctx, key, v, o)
}

type dlEnv struct {
	s     *Server
	mem   *state.MemoryStore
	st    *failingStore
	cat   *catalog.Catalog
	dl    *deadletter.Store
	deliv *delivery.Store
	pub   *publishtest.Recorder
}

// newDLServer serves the dead-letter RPCs over one MemoryStore, with
// workers w1 and w2 on topic "orders" and w3 on "payments". Temporal is a
// mock that fails the test when called.
func newDLServer(t *testing.T) *dlEnv {
	t.Helper()
	mem := state.NewMemoryStore()
	st := &failingStore{Store: mem}
	e := &dlEnv{mem: mem, st: st, cat: catalog.New(st), dl: deadletter.NewStore(st, 0), deliv: delivery.NewStore(st, time.Hour), pub: &publishtest.Recorder{}}
	e.s = New(slog.New(slog.NewTextHandler(io.Discard, nil)), mocks.NewClient(t), e.cat, engines.BuiltinMIMETypes(),
		Options{OperationTimeout: 5 * time.Second, DeadLetters: e.dl, Deliveries: e.deliv, Publisher: e.pub})
	for _, w := range [][2]string{{w1, "orders"}, {w2, "orders"}, {w3, "payments"}} { // creation order
		if err := e.cat.SaveWorker(context.Background(), catalog.Worker{ID: w[0], Topic: w[1], Status: catalog.StatusRunning}); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

func cloudEvent(id string) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"specversion":"1.0","id":%q,"source":"shop","type":"order.placed","correlationid":"c-1",`+
		`"datacontenttype":"application/json","data":{"n":1}}`, id))
}

// dead stores a dead letter of worker for event id and marks the worker
// dead in the message's delivery record (beside another worker that is done).
func (e *dlEnv) dead(t *testing.T, worker, topic, id, reason string, at int64) {
	t.Helper()
	ctx := context.Background()
	if err := e.dl.Add(ctx, deadletter.Entry{Worker: worker, Topic: topic, Reason: reason, Attempts: 3, Error: "boom",
		EventID: id, Source: "shop", Event: cloudEvent(id), AtMS: at}); err != nil {
		t.Fatal(err)
	}
	key := delivery.Key("shop", id)
	r, err := e.deliv.Load(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.deliv.Update(ctx, key, r, func(r *delivery.Record) {
		r.Set(worker, delivery.Worker{Outcome: delivery.Dead, Attempts: 3})
		r.Set("other", delivery.Worker{Outcome: delivery.Done, Attempts: 1})
	}); err != nil {
		t.Fatal(err)
	}
}

func (e *dlEnv) stored(t *testing.T, worker string) []string {
	t.Helper()
	es, err := e.dl.List(context.Background(), worker, deadletter.Filter{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, x := range es {
		ids = append(ids, x.EventID)
	}
	return ids
}

func wantCode(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(err.Error(), msg) {
		t.Fatalf("got %v, want %s containing %q", err, code, msg)
	}
}

// newDLServerWithFour has dead letters a (worker_failed), b (timeout) and c
// (worker_failed) of w1 and z (timeout) of w2, all on "orders", oldest first.
func newDLServerWithFour(t *testing.T) *dlEnv {
	e := newDLServer(t)
	e.dead(t, w1, "orders", "a", "worker_failed", 1000)
	e.dead(t, w1, "orders", "b", "timeout", 2000)
	e.dead(t, w1, "orders", "c", "worker_failed", 3000)
	e.dead(t, w2, "orders", "z", "timeout", 4000)
	return e
}

func TestListDeadLetters(t *testing.T) {
	e := newDLServerWithFour(t)
	ctx := context.Background()

	res, err := e.s.ListDeadLetters(ctx, &pb.ListDeadLettersRequest{WorkerId: w1})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.DeadLetters) != 3 {
		t.Fatalf("got %v", res.DeadLetters)
	}
	d := res.DeadLetters[0]
	if d.WorkerId != w1 || d.Topic != "orders" || d.Reason != "worker_failed" || d.Attempts != 3 || d.Error != "boom" ||
		d.EventId != "a" || d.Source != "shop" || d.At.AsTime().UnixMilli() != 1000 {
		t.Fatalf("first dead letter: %v", d)
	}
	res, err = e.s.ListDeadLetters(ctx, &pb.ListDeadLettersRequest{WorkerId: w1, Reason: "worker_failed", Limit: 1})
	if err != nil || len(res.DeadLetters) != 1 || res.DeadLetters[0].EventId != "a" {
		t.Fatalf("filtered: %v %v", res, err)
	}
	res, err = e.s.ListDeadLetters(ctx, &pb.ListDeadLettersRequest{WorkerId: w3})
	if err != nil || len(res.DeadLetters) != 0 {
		t.Fatalf("none: %v %v", res, err)
	}

	for name, c := range map[string]struct {
		req  *pb.ListDeadLettersRequest
		code codes.Code
		msg  string
	}{
		"no worker":      {&pb.ListDeadLettersRequest{}, codes.InvalidArgument, "worker_id is empty"},
		"malformed":      {&pb.ListDeadLettersRequest{WorkerId: "W_1"}, codes.InvalidArgument, `worker_id "W_1" is neither a worker id (a UUID) nor a worker name`},
		"unknown worker": {&pb.ListDeadLettersRequest{WorkerId: "44444444-4444-4444-8444-444444444444"}, codes.NotFound, "not found"},
		"unknown name":   {&pb.ListDeadLettersRequest{WorkerId: "no-such-worker"}, codes.NotFound, `worker "no-such-worker" not found`},
		"negative limit": {&pb.ListDeadLettersRequest{WorkerId: w1, Limit: -1}, codes.InvalidArgument, "limit -1 must be 0 (default 100) or 1..1000"},
		"limit too big":  {&pb.ListDeadLettersRequest{WorkerId: w1, Limit: 1001}, codes.InvalidArgument, "limit 1001"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := e.s.ListDeadLetters(ctx, c.req)
			wantCode(t, err, c.code, c.msg)
		})
	}
}

// Replaying a worker's dead letters resets its delivery record, republishes
// the original event to its topic marked for that worker only, and removes
// the dead letter; oldest first, up to the limit.
func TestReplayDeadLettersOfAWorker(t *testing.T) {
	e := newDLServerWithFour(t)
	ctx := context.Background()

	res, err := e.s.ReplayDeadLetters(ctx, &pb.ReplayDeadLettersRequest{WorkerId: w1, Reason: "worker_failed", Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res.Replayed != 1 || strings.Join(res.EventIds, ",") != "a" || res.Remaining != 1 {
		t.Fatalf("got %v", res)
	}
	if len(e.pub.All()) != 1 {
		t.Fatalf("published %v", e.pub.All())
	}
	p := e.pub.All()[0]
	if p.Topic != "orders" || p.Event.ID() != "a" || p.Event.Source() != "shop" || p.Event.Type() != "order.placed" ||
		p.Event.Extensions()["correlationid"] != "c-1" || p.Event.Extensions()[deadletter.ReplayExtension] != w1 || string(p.Event.Data()) != `{"n":1}` {
		t.Fatalf("republished %s to %s", p.Event, p.Topic)
	}
	r, err := e.deliv.Load(ctx, delivery.Key("shop", "a"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Workers[w1]; ok || r.Get("other").Outcome != delivery.Done {
		t.Fatalf("delivery record after replay: %+v", r.Workers)
	}
	if got := strings.Join(e.stored(t, w1), ","); got != "b,c" {
		t.Fatalf("still stored: %s", got)
	}

	res, err = e.s.ReplayDeadLetters(ctx, &pb.ReplayDeadLettersRequest{WorkerId: w1, EventIds: []string{"c"}})
	if err != nil || res.Replayed != 1 || res.EventIds[0] != "c" || res.Remaining != 0 {
		t.Fatalf("by event id: %v %v", res, err)
	}
	res, err = e.s.ReplayDeadLetters(ctx, &pb.ReplayDeadLettersRequest{WorkerId: w1})
	if err != nil || res.Replayed != 1 || res.EventIds[0] != "b" || res.Remaining != 0 {
		t.Fatalf("the rest: %v %v", res, err)
	}
	if got := e.stored(t, w2); len(got) != 1 {
		t.Fatalf("another worker's dead letters were touched: %v", got)
	}
}

// Replaying by topic takes every worker of the catalog on it, in creation
// order, within one limit; entries without their event are skipped and not
// counted.
func TestReplayDeadLettersOfATopic(t *testing.T) {
	e := newDLServer(t)
	ctx := context.Background()
	e.dead(t, w1, "orders", "a", "timeout", 1000)
	e.dead(t, w1, "orders", "b", "timeout", 2000)
	if err := e.dl.Add(ctx, deadletter.Entry{Worker: w2, Topic: "orders", Reason: "timeout", EventID: "raw", Source: "shop", Raw: []byte("?"), AtMS: 2500}); err != nil {
		t.Fatal(err)
	}
	e.dead(t, w2, "orders", "z", "timeout", 3000)
	e.dead(t, w3, "payments", "p", "timeout", 3000)
	if err := e.dl.Add(ctx, deadletter.Entry{Topic: "orders", Reason: "undecodable", Raw: []byte("?")}); err != nil {
		t.Fatal(err)
	}

	res, err := e.s.ReplayDeadLetters(ctx, &pb.ReplayDeadLettersRequest{Topic: "orders", Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.Replayed != 2 || strings.Join(res.EventIds, ",") != "a,b" || res.Remaining != 1 {
		t.Fatalf("first page: %v", res)
	}
	res, err = e.s.ReplayDeadLetters(ctx, &pb.ReplayDeadLettersRequest{Topic: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Replayed != 1 || strings.Join(res.EventIds, ",") != "z" || res.Remaining != 0 {
		t.Fatalf("second page: %v", res)
	}
	for _, p := range e.pub.All() {
		want := w1
		if p.Event.ID() == "z" {
			want = w2
		}
		if p.Topic != "orders" || p.Event.Extensions()[deadletter.ReplayExtension] != want {
			t.Fatalf("republished %s to %s", p.Event, p.Topic)
		}
	}
	if got := e.stored(t, w2); strings.Join(got, ",") != "raw" {
		t.Fatalf("the entry without event: %v", got)
	}
	if got := e.stored(t, w3); len(got) != 1 {
		t.Fatalf("a worker on another topic was replayed: %v", got)
	}
}

func TestReplayDeadLettersBadRequests(t *testing.T) {
	e := newDLServer(t)
	e.dead(t, w1, "orders", "a", "timeout", 1000)
	ctx := context.Background()
	for name, c := range map[string]struct {
		req  *pb.ReplayDeadLettersRequest
		code codes.Code
		msg  string
	}{
		"both":            {&pb.ReplayDeadLettersRequest{WorkerId: w1, Topic: "orders"}, codes.InvalidArgument, "exactly one of worker_id and topic, not both"},
		"neither":         {&pb.ReplayDeadLettersRequest{Reason: "timeout"}, codes.InvalidArgument, "exactly one of worker_id and topic"},
		"malformed id":    {&pb.ReplayDeadLettersRequest{WorkerId: "no pe"}, codes.InvalidArgument, `worker_id "no pe" is neither a worker id (a UUID) nor a worker name`},
		"malformed topic": {&pb.ReplayDeadLettersRequest{Topic: "has space"}, codes.InvalidArgument, `topic "has space" must match`},
		"unknown worker":  {&pb.ReplayDeadLettersRequest{WorkerId: "44444444-4444-4444-8444-444444444444"}, codes.NotFound, "worker 44444444-4444-4444-8444-444444444444 not found"},
		"unknown name":    {&pb.ReplayDeadLettersRequest{WorkerId: "no-such-worker"}, codes.NotFound, `worker "no-such-worker" not found`},
		"no worker on topic": {&pb.ReplayDeadLettersRequest{Topic: "nobody-listens"}, codes.NotFound,
			`no worker in the catalog subscribes to topic "nobody-listens"`},
		"negative limit": {&pb.ReplayDeadLettersRequest{WorkerId: w1, Limit: -5}, codes.InvalidArgument, "limit -5 must be 0 (default 100) or 1..1000"},
		"limit too big":  {&pb.ReplayDeadLettersRequest{WorkerId: w1, Limit: 5000}, codes.InvalidArgument, "limit 5000"},
		"empty event id": {&pb.ReplayDeadLettersRequest{WorkerId: w1, EventIds: []string{"a", ""}}, codes.InvalidArgument, "event_ids[1] must be 1 to 512 characters"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := e.s.ReplayDeadLetters(ctx, c.req)
			wantCode(t, err, c.code, c.msg)
		})
	}
	if len(e.pub.All()) != 0 || len(e.stored(t, w1)) != 1 {
		t.Fatalf("a bad request replayed something: %v", e.pub.All())
	}
}

// A publish that fails stops the replay with UNAVAILABLE and keeps the
// entry at hand (and the ones after it); what was replayed before is gone.
func TestReplayPublishFailureKeepsTheEntry(t *testing.T) {
	e := newDLServer(t)
	e.dead(t, w1, "orders", "a", "timeout", 1000)
	e.dead(t, w1, "orders", "b", "timeout", 2000)
	e.dead(t, w1, "orders", "c", "timeout", 3000)
	e.pub.FailWhen(func(_ string, ev *event.Event) error {
		if ev.ID() == "b" {
			return errors.New("broker down")
		}
		return nil
	})
	_, err := e.s.ReplayDeadLetters(context.Background(), &pb.ReplayDeadLettersRequest{WorkerId: w1})
	wantCode(t, err, codes.Unavailable, "broker down")
	wantCode(t, err, codes.Unavailable, "1 dead letters were replayed before")
	if got := strings.Join(e.stored(t, w1), ","); got != "b,c" {
		t.Fatalf("stored after the failure: %s", got)
	}
	e.pub.FailWhen(nil)
	res, err := e.s.ReplayDeadLetters(context.Background(), &pb.ReplayDeadLettersRequest{WorkerId: w1})
	if err != nil || strings.Join(res.EventIds, ",") != "b,c" {
		t.Fatalf("after the broker came back: %v %v", res, err)
	}
}

// A removal that fails after the publish is reported; the entry stays and
// the next replay publishes it again (at least once).
func TestReplayRemoveFailureReplaysAgain(t *testing.T) {
	e := newDLServer(t)
	e.dead(t, w1, "orders", "a", "timeout", 1000)
	e.st.fail = func(op, key string) error {
		if op == "put" && strings.HasPrefix(key, state.KeyPrefix+"deadletters/") || op == "delete" && strings.HasPrefix(key, state.KeyPrefix+"deadletters/") {
			return errors.New("state store down")
		}
		return nil
	}
	_, err := e.s.ReplayDeadLetters(context.Background(), &pb.ReplayDeadLettersRequest{WorkerId: w1})
	wantCode(t, err, codes.Unavailable, "removing its dead letter failed")
	if len(e.pub.All()) != 1 || len(e.stored(t, w1)) != 1 {
		t.Fatalf("published %d, stored %v", len(e.pub.All()), e.stored(t, w1))
	}
	e.st.fail = nil
	res, err := e.s.ReplayDeadLetters(context.Background(), &pb.ReplayDeadLettersRequest{WorkerId: w1})
	if err != nil || res.Replayed != 1 || len(e.pub.All()) != 2 || len(e.stored(t, w1)) != 0 {
		t.Fatalf("second replay: %v %v, published %d", res, err, len(e.pub.All()))
	}
}

// A delivery record that cannot be reset stops the replay before anything
// is published.
func TestReplayResetFailurePublishesNothing(t *testing.T) {
	e := newDLServer(t)
	e.dead(t, w1, "orders", "a", "timeout", 1000)
	e.st.fail = func(op, key string) error {
		if op == "put" && strings.HasPrefix(key, state.KeyPrefix+"delivery/") {
			return errors.New("state store down")
		}
		return nil
	}
	_, err := e.s.ReplayDeadLetters(context.Background(), &pb.ReplayDeadLettersRequest{WorkerId: w1})
	wantCode(t, err, codes.Unavailable, "reset delivery record of event a")
	if len(e.pub.All()) != 0 || len(e.stored(t, w1)) != 1 {
		t.Fatalf("published %v, stored %v", e.pub.All(), e.stored(t, w1))
	}
}

func TestDeadLetterRPCsNeedTheirStores(t *testing.T) {
	s, _ := newServer(t, mocks.NewClient(t))
	_, err := s.ListDeadLetters(context.Background(), &pb.ListDeadLettersRequest{WorkerId: w1})
	wantCode(t, err, codes.Unimplemented, "not configured")
	_, err = s.ReplayDeadLetters(context.Background(), &pb.ReplayDeadLettersRequest{WorkerId: w1})
	wantCode(t, err, codes.Unimplemented, "not configured")
}

// The retry policy is validated at create and goes into the record the
// workflow starts with; workers return it.
func TestCreateWorkerRetryPolicy(t *testing.T) {
	code := &pb.CodeSource{Source: &pb.CodeSource_Content{Content: []byte("def process(e): pass")}}
	for name, c := range map[string]struct {
		rp   *pb.RetryPolicy
		want string
	}{
		"attempts negative": {&pb.RetryPolicy{MaxAttempts: -1}, "retry_policy.max_attempts -1 must be 0 (cluster default) or 1..100"},
		"attempts too many": {&pb.RetryPolicy{MaxAttempts: 101}, "retry_policy.max_attempts 101"},
		"backoff negative":  {&pb.RetryPolicy{MaxAttempts: 3, BackoffMs: -1}, "retry_policy.backoff_ms -1"},
		"backoff too long":  {&pb.RetryPolicy{BackoffMs: 3_600_001}, "retry_policy.backoff_ms 3600001 must be 0 (cluster default) to 3600000"},
	} {
		t.Run(name, func(t *testing.T) {
			s, store := newServer(t, mocks.NewClient(t))
			_, err := s.CreateWorker(context.Background(), &pb.CreateWorkerRequest{Code: code, MimeType: engines.MIMEPython, Topic: "t", RetryPolicy: c.rp})
			wantCode(t, err, codes.InvalidArgument, c.want)
			if keys := store.Keys(); len(keys) != 0 {
				t.Fatalf("something was stored: %v", keys)
			}
		})
	}

	s, input := serverCapturingCreate(t)
	res, err := s.CreateWorker(context.Background(), &pb.CreateWorkerRequest{Code: code, MimeType: engines.MIMEPython, Topic: "t",
		RetryPolicy: &pb.RetryPolicy{MaxAttempts: 7, BackoffMs: 1500}})
	if err != nil {
		t.Fatal(err)
	}
	if w := input().State.Worker; w.ID != res.WorkerId || w.MaxAttempts != 7 || w.RetryBackoff != 1500*time.Millisecond {
		t.Fatalf("workflow starts with %+v", w)
	}

	if p := toProto(input().State.Worker).RetryPolicy; p.GetMaxAttempts() != 7 || p.GetBackoffMs() != 1500 {
		t.Fatalf("returned retry policy %v", p)
	}
	if p := toProto(catalog.Worker{ID: "x"}).RetryPolicy; p != nil {
		t.Fatalf("a worker with the cluster default returns %v", p)
	}
}

// The output and gateway policy is validated at create, goes into the
// record the workflow starts with, and workers return it.
func TestCreateWorkerPolicy(t *testing.T) {
	code := &pb.CodeSource{Source: &pb.CodeSource_Content{Content: []byte("def process(e): pass")}}
	for name, c := range map[string]struct {
		outputs, targets []string
		want             string
	}{
		"reserved output": {[]string{"workmanager.lifecycle"}, nil, "allowed_output_topics: \"workmanager.lifecycle\" is a reserved topic"},
		"bad pattern":     {[]string{"a["}, nil, "allowed_output_topics: pattern \"a[\": syntax error in pattern"},
		"bad target":      {nil, []string{"billing"}, "allowed_gateway_targets: \"billing\" must be \"service/method\""},
	} {
		t.Run(name, func(t *testing.T) {
			s, store := newServer(t, mocks.NewClient(t))
			_, err := s.CreateWorker(context.Background(), &pb.CreateWorkerRequest{Code: code, MimeType: engines.MIMEPython, Topic: "t",
				AllowedOutputTopics: c.outputs, AllowedGatewayTargets: c.targets})
			wantCode(t, err, codes.InvalidArgument, c.want)
			if keys := store.Keys(); len(keys) != 0 {
				t.Fatalf("something was stored: %v", keys)
			}
		})
	}

	s, input := serverCapturingCreate(t)
	if _, err := s.CreateWorker(context.Background(), &pb.CreateWorkerRequest{Code: code, MimeType: engines.MIMEPython, Topic: "t",
		AllowedOutputTopics: []string{"billing.*"}, AllowedGatewayTargets: []string{"billing/*"}}); err != nil {
		t.Fatal(err)
	}
	w := toProto(input().State.Worker)
	if fmt.Sprint(w.GetAllowedOutputTopics(), w.GetAllowedGatewayTargets()) != "[billing.*] [billing/*]" {
		t.Fatalf("worker %v", w)
	}
}

// serverCapturingCreate returns a Server whose Temporal client accepts one
// create (Update-With-Start) and a function returning the workflow input it
// was given.
func serverCapturingCreate(t *testing.T) (*Server, func() workflows.WorkerInput) {
	t.Helper()
	tc := mocks.NewClient(t)
	var input workflows.WorkerInput
	tc.On("NewWithStartWorkflowOperation", mock.Anything, mock.Anything, mock.Anything).Run(func(args mock.Arguments) {
		input = args.Get(2).(workflows.WorkerInput)
	}).Return(nil).Once()
	h := mocks.NewWorkflowUpdateHandle(t)
	h.On("Get", mock.Anything, mock.Anything).Return(nil).Once()
	tc.On("UpdateWithStartWorkflow", mock.Anything, mock.Anything).Return(func(context.Context, client.UpdateWithStartWorkflowOptions) (client.WorkflowUpdateHandle, error) {
		return h, nil
	}).Once()
	s, _ := newServer(t, tc)
	return s, func() workflows.WorkerInput { return input }
}
