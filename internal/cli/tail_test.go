package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"
	"google.golang.org/protobuf/types/known/structpb"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// TestPublishWarnsWithoutARunningSubscriber (issue 44 item 5): a publish to
// a topic no running worker subscribes to (a typo, a stopped worker) still
// publishes and exits 0, and says so on stderr.
func TestPublishWarnsWithoutARunningSubscriber(t *testing.T) {
	api := startFake(t, nil)
	api.add(&pb.Worker{WorkerId: "w-1", Name: "pricer", Topic: "orders", Status: pb.WorkerStatus_WORKER_STATUS_RUNNING})
	api.add(&pb.Worker{WorkerId: "w-2", Name: "shipper", Topic: "shipping", Status: pb.WorkerStatus_WORKER_STATUS_STOPPED})
	d, addr := startFakeDapr(t)
	env := map[string]string{"DAPR_GRPC_ADDRESS": addr, "WMCTL_ADDR": api.addr, "WMCTL_TOKEN": goodToken}
	for topic, want := range map[string]string{
		"orders":   "",
		"ordrs":    `no running worker subscribes to topic "ordrs"`,
		"shipping": "stopped there: shipper",
	} {
		r := run(t, env, "", "publish", topic, "--id", "e-"+topic)
		if r.code != 0 || r.out != "e-"+topic+"\n" {
			t.Errorf("publish %s: exit %d out %q err %q", topic, r.code, r.out, r.err)
		}
		if (want == "") != (r.err == "") || !strings.Contains(r.err, want) {
			t.Errorf("publish %s: stderr %q, want %q", topic, r.err, want)
		}
	}
	d.mu.Lock()
	n := len(d.published)
	d.mu.Unlock()
	if n != 3 {
		t.Errorf("%d published, want 3", n)
	}
	// Without an API at hand (publish needs only daprd) nothing is said.
	if r := run(t, map[string]string{"DAPR_GRPC_ADDRESS": addr, "WMCTL_ADDR": "127.0.0.1:1"}, "", "publish", "ordrs"); r.code != 0 || r.err != "" {
		t.Errorf("publish without the API: exit %d err %q", r.code, r.err)
	}
}

func output(t *testing.T, id, typ, corr string, at time.Time, data string) *runtimev1.TopicEventRequest {
	t.Helper()
	x := map[string]any{"correlationid": corr}
	if !at.IsZero() {
		x["time"] = at.Format(time.RFC3339Nano)
	}
	s, err := structpb.NewStruct(x)
	if err != nil {
		t.Fatal(err)
	}
	return &runtimev1.TopicEventRequest{Id: id, Type: typ, Source: "worker", SpecVersion: "1.0", DataContentType: "application/json",
		Data: []byte(data), Topic: typ, PubsubName: "pubsub", Extensions: s}
}

// TestTail (issue 44 item 5): 'wmctl tail TOPIC' prints the events of a
// topic (no redis-cli needed), skips those older than --since, stops after
// --count, and refuses a worker's input topic, whose messages it would take.
func TestTail(t *testing.T) {
	api := startFake(t, nil)
	api.add(&pb.Worker{WorkerId: "w-1", Name: "pricer", Topic: "orders", Status: pb.WorkerStatus_WORKER_STATUS_STOPPED})
	now := time.Now()
	d, addr := startFakeDapr(t,
		output(t, "old", "order.priced", "c-0", now.Add(-time.Hour), `{"total":1}`),
		output(t, "o-1", "order.priced", "c-42", now, `{"order_id": "o-1", "total": 6}`),
		output(t, "o-2", "order.priced", "", time.Time{}, `{"total":7}`),
	)
	env := map[string]string{"DAPR_GRPC_ADDRESS": addr, "WMCTL_ADDR": api.addr, "WMCTL_TOKEN": goodToken}
	r := run(t, env, "", "tail", "order.priced", "--count", "2")
	lines := strings.Split(strings.TrimSpace(r.out), "\n")
	if r.code != 0 || len(lines) != 2 || !strings.Contains(lines[0], `order.priced  id="o-1" correlationid="c-42" data={"order_id":"o-1","total":6}`) ||
		!strings.HasPrefix(lines[1], "-") || !strings.Contains(lines[1], `id="o-2" data={"total":7}`) {
		t.Errorf("tail: exit %d err %q out:\n%s", r.code, r.err, r.out)
	}
	d.mu.Lock()
	topic, acks := d.initial.GetTopic(), len(d.acks)
	d.mu.Unlock()
	if topic != "order.priced" || acks < 2 {
		t.Errorf("subscribed to %q, %d acks", topic, acks)
	}

	_, addr = startFakeDapr(t, output(t, "o-1", "order.priced", "c-42", now, `{"total":6}`))
	env["DAPR_GRPC_ADDRESS"] = addr
	r = run(t, env, "", "tail", "order.priced", "-n", "1", "-o", "json")
	var ev map[string]any
	if err := json.Unmarshal([]byte(r.out), &ev); err != nil || r.code != 0 || ev["id"] != "o-1" ||
		ev["extensions"].(map[string]any)["correlationid"] != "c-42" || ev["data"].(map[string]any)["total"] != 6.0 {
		t.Errorf("tail -o json: exit %d err %q out %q (%v)", r.code, r.err, r.out, err)
	}
	// An event's subject (a keyed group's key) is shown.
	keyed := output(t, "k-1", "order.priced", "", now, `{"total":6}`)
	keyed.Extensions.Fields["subject"] = structpb.NewStringValue("order-7")
	_, kaddr := startFakeDapr(t, keyed)
	if r := run(t, map[string]string{"DAPR_GRPC_ADDRESS": kaddr, "WMCTL_ADDR": api.addr, "WMCTL_TOKEN": goodToken}, "", "tail", "order.priced", "-n", "1"); r.code != 0 ||
		!strings.Contains(r.out, `id="k-1" subject="order-7" data={"total":6}`) {
		t.Errorf("tail of an event with a subject: exit %d err %q out %q", r.code, r.err, r.out)
	}
	// Fewer events than --count within --timeout: exit 6.
	if r := run(t, env, "", "tail", "order.priced", "-n", "5", "--timeout", "1s"); r.code != 6 || !strings.Contains(r.err, "of 5 events") {
		t.Errorf("tail short of --count: exit %d err %q", r.code, r.err)
	}
	if r := run(t, env, "", "tail", "orders"); r.code != 2 || !strings.Contains(r.err, "input of pricer") {
		t.Errorf("tail of a worker's input topic: exit %d err %q", r.code, r.err)
	}
	if r := run(t, env, "", "tail", "my topic"); r.code != 2 {
		t.Errorf("tail of an invalid topic: exit %d err %q", r.code, r.err)
	}
}
