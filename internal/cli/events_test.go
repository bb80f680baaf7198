package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/structpb"
	"gopkg.in/yaml.v3"

	"github.com/virtufin/workmanager/internal/lifecycleevents"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// fakeDapr serves the two daprd RPCs wmctl uses: it streams events to one
// subscriber and records acks and publishes.
type fakeDapr struct {
	runtimev1.UnimplementedDaprServer
	events []*runtimev1.TopicEventRequest

	mu        sync.Mutex
	initial   *runtimev1.SubscribeTopicEventsRequestInitialAlpha1
	acks      []string
	published []*runtimev1.PublishEventRequest
	allAcked  chan struct{}
}

func startFakeDapr(t *testing.T, events ...*runtimev1.TopicEventRequest) (*fakeDapr, string) {
	t.Helper()
	f := &fakeDapr{events: events, allAcked: make(chan struct{})}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	runtimev1.RegisterDaprServer(s, f)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return f, lis.Addr().String()
}

func (f *fakeDapr) SubscribeTopicEventsAlpha1(st runtimev1.Dapr_SubscribeTopicEventsAlpha1Server) error {
	req, err := st.Recv()
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.initial = req.GetInitialRequest()
	f.mu.Unlock()
	if err := st.Send(&runtimev1.SubscribeTopicEventsResponseAlpha1{SubscribeTopicEventsResponseType: &runtimev1.SubscribeTopicEventsResponseAlpha1_InitialResponse{
		InitialResponse: &runtimev1.SubscribeTopicEventsResponseInitialAlpha1{}}}); err != nil {
		return err
	}
	for _, ev := range f.events {
		if err := st.Send(&runtimev1.SubscribeTopicEventsResponseAlpha1{SubscribeTopicEventsResponseType: &runtimev1.SubscribeTopicEventsResponseAlpha1_EventMessage{EventMessage: ev}}); err != nil {
			return err
		}
	}
	for {
		req, err := st.Recv()
		if err != nil {
			return nil
		}
		p := req.GetEventProcessed()
		if p == nil || p.GetStatus().GetStatus() != runtimev1.TopicEventResponse_SUCCESS {
			continue
		}
		f.mu.Lock()
		f.acks = append(f.acks, p.GetId())
		if len(f.acks) == len(f.events) {
			close(f.allAcked)
		}
		f.mu.Unlock()
	}
}

func (f *fakeDapr) PublishEvent(_ context.Context, r *runtimev1.PublishEventRequest) (*emptypb.Empty, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.published = append(f.published, r)
	return &emptypb.Empty{}, nil
}

func lifecycle(t *testing.T, id, kind string, at time.Time, d lifecycleevents.Data) *runtimev1.TopicEventRequest {
	t.Helper()
	data, _ := json.Marshal(d)
	x, err := structpb.NewStruct(map[string]any{"time": at.Format(time.RFC3339Nano), "subject": d.WorkerID, "tenant": "default"})
	if err != nil {
		t.Fatal(err)
	}
	return &runtimev1.TopicEventRequest{Id: id, Type: lifecycleevents.TypePrefix + kind, Source: lifecycleevents.Source, SpecVersion: "1.0",
		DataContentType: "application/json", Data: data, Topic: lifecycleevents.Topic, PubsubName: "pubsub", Extensions: x}
}

// followFake runs `wmctl events --follow` (a.follow) against events until
// all are acked, and returns what it printed.
func followFake(t *testing.T, output, worker string, cutoff time.Time, events ...*runtimev1.TopicEventRequest) (string, *fakeDapr) {
	t.Helper()
	f, addr := startFakeDapr(t, events...)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var out bytes.Buffer
	a := &app{io: IO{Out: &out, Err: &bytes.Buffer{}}, output: output, cfg: Config{Dapr: addr, Pubsub: "pubsub"}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.follow(ctx, runtimev1.NewDaprClient(conn), lifecycleevents.Topic, worker, cutoff) }()
	select {
	case <-f.allAcked:
	case err := <-done:
		t.Fatalf("follow ended early: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("not every event acked within 10s")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("follow after interrupt: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("follow did not end on interrupt")
	}
	return out.String(), f
}

func TestEventsFollow(t *testing.T) {
	now := time.Now().UTC()
	evs := []*runtimev1.TopicEventRequest{
		lifecycle(t, "e-old", "created", now.Add(-time.Hour), lifecycleevents.Data{WorkerID: "w-1", Topic: "orders"}),
		lifecycle(t, "e-1", "stopped", now, lifecycleevents.Data{WorkerID: "w-1", Topic: "orders", Group: "shop", CodeVersion: 2}),
		lifecycle(t, "e-2", "error", now.Add(time.Millisecond), lifecycleevents.Data{WorkerID: "w-2", Topic: "in", ErrorType: "worker_failed",
			ErrorMessage: "ValueError: asked to fail", EventID: "m1", Attempt: 1, MaxAttempts: 3}),
	}
	out, f := followFake(t, "table", "", now.Add(-5*time.Second), evs...)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("printed %d lines, want 2 (the old event skipped):\n%s", len(lines), out)
	}
	if f := strings.Fields(lines[0]); len(f) != 6 || f[1] != "stopped" || f[2] != "w-1" || f[3] != "topic=orders" || f[4] != "group=shop" || f[5] != "version=2" {
		t.Errorf("line %q", lines[0])
	}
	if !strings.Contains(lines[1], "error") || !strings.Contains(lines[1], `event=m1 attempt=1/3 error_type=worker_failed error="ValueError: asked to fail"`) {
		t.Errorf("line %q", lines[1])
	}
	if !strings.HasPrefix(lines[0], now.Format("2006-01-02T15:04:05.000Z")) {
		t.Errorf("line %q does not start with the event's time", lines[0])
	}
	f.mu.Lock()
	if f.initial.GetTopic() != lifecycleevents.Topic || f.initial.GetPubsubName() != "pubsub" || strings.Join(f.acks, ",") != "e-old,e-1,e-2" {
		t.Errorf("subscription %v, acks %v (want every event acked)", f.initial, f.acks)
	}
	f.mu.Unlock()

	// -o json: one object per line; --worker filters.
	out, _ = followFake(t, "json", "w-2", now.Add(-5*time.Second), evs...)
	lines = strings.Split(strings.TrimSpace(out), "\n")
	var ev struct {
		ID, Type, Time, Tenant string
		Data                   lifecycleevents.Data
	}
	if len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &ev) != nil || ev.ID != "e-2" || ev.Type != lifecycleevents.TypePrefix+"error" ||
		ev.Data.WorkerID != "w-2" || ev.Data.Attempt != 1 || ev.Tenant != "default" || ev.Time == "" {
		t.Errorf("events -o json --worker w-2:\n%s", out)
	}

	// -o yaml: a document per event.
	out, _ = followFake(t, "yaml", "", now.Add(-2*time.Hour), evs...)
	dec := yaml.NewDecoder(strings.NewReader(out))
	n := 0
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); err != nil {
			break
		}
		n++
		if doc["id"] == nil || doc["data"] == nil {
			t.Errorf("yaml document %v", doc)
		}
	}
	if n != 3 {
		t.Errorf("%d yaml documents, want 3 (--since covers the old one):\n%s", n, out)
	}
}

func TestPublish(t *testing.T) {
	f, addr := startFakeDapr(t)
	r := run(t, map[string]string{"DAPR_GRPC_ADDRESS": addr}, "", "publish", "orders", "--id", "o-1", "--type", "order.placed",
		"--data", `{"qty":3}`, "--correlation-id", "c-42", "--source", "shop", "--subject", "order-7", "--ext", "tier=gold")
	if r.code != 0 || r.out != "o-1\n" {
		t.Fatalf("publish: exit %d out %q err %q", r.code, r.out, r.err)
	}
	f.mu.Lock()
	p := f.published[0]
	f.mu.Unlock()
	var ce map[string]any
	if err := json.Unmarshal(p.Data, &ce); err != nil {
		t.Fatal(err)
	}
	if p.PubsubName != "pubsub" || p.Topic != "orders" || p.DataContentType != "application/cloudevents+json" || ce["id"] != "o-1" ||
		ce["type"] != "order.placed" || ce["source"] != "shop" || ce["subject"] != "order-7" || ce["correlationid"] != "c-42" || ce["tier"] != "gold" ||
		ce["specversion"] != "1.0" || ce["datacontenttype"] != "application/json" || ce["data"].(map[string]any)["qty"] != 3.0 {
		t.Errorf("published %s %s: %v", p.Topic, p.DataContentType, ce)
	}
	// A generated id is printed; -o json prints the event.
	r = run(t, map[string]string{"DAPR_GRPC_ADDRESS": addr}, "", "publish", "orders", "-o", "json")
	if err := json.Unmarshal([]byte(r.out), &ce); r.code != 0 || err != nil || len(ce["id"].(string)) != 36 || ce["type"] != "wmctl.test" {
		t.Errorf("publish -o json: %d %q %v", r.code, r.out, err)
	}
	if r := run(t, map[string]string{"DAPR_GRPC_ADDRESS": addr}, "", "publish", "orders", "--data", "{not json"); r.code != 2 {
		t.Errorf("bad --data: exit %d %q", r.code, r.err)
	}
	// Issue 44 item 5: a topic a worker could not have, and WorkManager's
	// own topics, are refused before anything is published.
	for topic, want := range map[string]string{
		"my topic":              "must match",
		"workmanager.lifecycle": "is reserved",
		"orders-dead":           "is reserved",
	} {
		if r := run(t, map[string]string{"DAPR_GRPC_ADDRESS": addr}, "", "publish", topic, "--type", "x"); r.code != 2 || !strings.Contains(r.err, want) {
			t.Errorf("publish %q: exit %d %q, want 2 and %q", topic, r.code, r.err, want)
		}
	}
	f.mu.Lock()
	n := len(f.published)
	f.mu.Unlock()
	if n != 2 {
		t.Errorf("%d events published, want the 2 valid ones", n)
	}
}

// TestEventsWorkerResolution: --worker takes an id as it is (no API
// needed) and a name through the API.
func TestEventsWorkerResolution(t *testing.T) {
	f := startFake(t, nil)
	f.add(&pb.Worker{WorkerId: "w-1", Name: "pricer", Topic: "orders"})
	a := &app{io: IO{Out: &bytes.Buffer{}, Err: &bytes.Buffer{}}, cfg: Config{Addr: "127.0.0.1:1", Token: goodToken, Timeout: 5 * time.Second}}
	for _, id := range []string{"6f1c2f6e-8a51-4f0e-9a43-0c7a3c1f2b11", "acme.6f1c2f6e-8a51-4f0e-9a43-0c7a3c1f2b11"} {
		if got, err := a.resolveWorker(context.Background(), id); err != nil || got != id {
			t.Errorf("resolveWorker(%q) without an API = %q, %v; want the id itself", id, got, err)
		}
	}
	a = &app{io: a.io, cfg: Config{Addr: f.addr, Token: goodToken, Timeout: 5 * time.Second}}
	if got, err := a.resolveWorker(context.Background(), "pricer"); err != nil || got != "w-1" {
		t.Errorf("resolveWorker(pricer) = %q, %v; want w-1", got, err)
	}
}
