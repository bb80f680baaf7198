package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/virtufin/workmanager/internal/lifecycleevents"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// pricerWorker prices an order's items; an item without "price" raises
// KeyError on line 3 of its file.
func pricerWorker(out string) []byte {
	return []byte(`
def price(item):
    return item["price"] * item["qty"]

def process(event):
    items = event["data"]["items"]
    return {"type": "` + out + `", "data": {"total": sum(price(i) for i in items)}}
`)
}

// Issue 44 items 2 and 3, on the real stack: a Python worker raising
// KeyError dead-letters the message with a traceback that names the
// worker's file and line (in the stored dead letter, its error events and
// the dead_lettered event, which name the worker too), and GetWorker counts
// the processed message, the failed attempt and the dead letter, with the
// last error (the nodes report every few seconds: waited on).
func testFailuresSayWhere(t *testing.T) {
	e := sharedEnv(t)
	in, out := topicName(t, "in"), topicName(t, "out")
	outs := e.subscribe(out)
	name := "pricer-" + uuid.NewString()[:8]
	id := e.createWith(t, &pb.CreateWorkerRequest{Code: pyCode(pricerWorker(out)), Topic: in, Name: name,
		RetryPolicy: &pb.RetryPolicy{MaxAttempts: 1}})
	e.publish(in, "o-1", map[string]any{"items": []any{map[string]any{"sku": "a", "price": 2, "qty": 3}}}, "")
	expectEvent(t, outs, 30*time.Second)
	e.publish(in, "o-2", map[string]any{"items": []any{map[string]any{"sku": "b", "qty": 1}}}, "")

	const frame = `File "<worker>", line 3, in price`
	ev := e.waitLifecycle(id, lifecycleevents.DeadLettered, 60*time.Second)
	if ev.Data.WorkerName != name || ev.Data.EventID != "o-2" || !strings.Contains(ev.Data.Traceback, frame) ||
		!strings.HasSuffix(strings.TrimSpace(ev.Data.Traceback), "KeyError: 'price'") {
		t.Fatalf("dead_lettered event: %+v", ev.Data)
	}
	if ev := e.waitLifecycle(id, lifecycleevents.Error, 10*time.Second); ev.Data.WorkerName != name || !strings.Contains(ev.Data.Traceback, frame) {
		t.Fatalf("error event: %+v", ev.Data)
	}
	resp, err := e.client.ListDeadLetters(ctxT(t), &pb.ListDeadLettersRequest{WorkerId: name})
	if err != nil {
		t.Fatal(err)
	}
	if ds := resp.GetDeadLetters(); len(ds) != 1 || ds[0].GetEventId() != "o-2" || !strings.Contains(ds[0].GetTraceback(), frame) ||
		!strings.Contains(ds[0].GetError(), "KeyError: 'price'") {
		t.Fatalf("dead letters %v", ds)
	}

	var w *pb.Worker
	waitFor(t, 60*time.Second, "GetWorker's stats to count o-1 and o-2", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		w, err = e.client.GetWorker(ctx, &pb.GetWorkerRequest{WorkerId: name})
		s := w.GetStats()
		return err == nil && s.GetProcessed() >= 1 && s.GetDeadLettered() >= 1
	})
	s := w.GetStats()
	if s.GetProcessed() != 1 || s.GetFailed() != 1 || s.GetDeadLettered() != 1 || s.GetLastErrorEventId() != "o-2" ||
		!strings.Contains(s.GetLastError(), "KeyError: 'price'") || time.Since(s.GetLastErrorAt().AsTime()) > 10*time.Minute {
		t.Fatalf("stats %v", s)
	}
	if m := e.httpGet(t, "/metrics"); !strings.Contains(m, `worker_name="`+name+`"`) {
		t.Errorf("no metric carries worker_name=%q", name)
	}
	// wmctl: the dead letter's line says where it failed; get shows the
	// counts and the last error.
	cli := newWmctl(t, e)
	if shown := cli.ok("dead-letters", name); !strings.Contains(shown, "LAST FRAME") || !strings.Contains(shown, "<worker>:3 in price") {
		t.Errorf("wmctl dead-letters:\n%s", shown)
	}
	shown := cli.ok("get", name)
	for _, want := range []string{"Processed:", "Failed attempts:", "Dead-lettered:", "KeyError: 'price'", "(event o-2)"} {
		if !strings.Contains(shown, want) {
			t.Errorf("wmctl get lacks %q:\n%s", want, shown)
		}
	}
	t.Logf("wmctl get %s:\n%s", name, shown)
}
