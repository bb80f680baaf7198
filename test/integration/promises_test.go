package integration

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// CreateWorker with a request id is idempotent on the real stack: a retry
// after a client timeout and concurrent twins yield one worker; reusing the
// id for other parameters or after the worker was deleted is
// ALREADY_EXISTS; a create that failed (bad code) leaves the id usable.
func TestCreateWithRequestIDMakesOneWorker(t *testing.T) {
	e := newEnv(t, "")
	topic := topicName(t, "in")
	req := func(rid string, code []byte) *pb.CreateWorkerRequest {
		return &pb.CreateWorkerRequest{Code: pyCode(code), MimeType: "text/x-python", Topic: topic, RequestId: rid}
	}
	good := echoWorker(topicName(t, "out"), "v1")
	onTopic := func() []string {
		t.Helper()
		l, err := e.client.ListWorkers(ctxT(t), &pb.ListWorkersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, w := range l.GetWorkers() {
			if w.GetTopic() == topic {
				ids = append(ids, w.GetWorkerId())
			}
		}
		return ids
	}

	// A first call cut off by its deadline, then the retry.
	short, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	first, ferr := e.client.CreateWorker(short, req("order-1", good))
	cancel()
	retry, err := e.client.CreateWorker(ctxT(t), req("order-1", good))
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	if ferr == nil && first.GetWorkerId() != retry.GetWorkerId() {
		t.Fatalf("first call made %s, retry %s", first.GetWorkerId(), retry.GetWorkerId())
	}
	t.Logf("first call: %v", ferr)

	// Concurrent twins.
	var wg sync.WaitGroup
	ids := make([]string, 4)
	errs := make([]error, 4)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := e.client.CreateWorker(ctxT(t), req("order-2", good))
			ids[i], errs[i] = r.GetWorkerId(), err
		}()
	}
	wg.Wait()
	for i := range ids {
		if errs[i] != nil || ids[i] != ids[0] {
			t.Fatalf("twin %d: %s %v (twin 0: %s)", i, ids[i], errs[i], ids[0])
		}
	}
	if got := onTopic(); len(got) != 2 {
		t.Fatalf("workers on the topic %v, want 2 (one per request id)", got)
	}

	// The same id for other parameters.
	other := req("order-1", good)
	other.Topic = topic + "-elsewhere"
	if _, err := e.client.CreateWorker(ctxT(t), other); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("request id reused for another topic: %v, want ALREADY_EXISTS", err)
	}

	// After the delete the id does not bring the worker back.
	if _, err := e.client.DeleteWorker(ctxT(t), &pb.DeleteWorkerRequest{WorkerId: retry.GetWorkerId()}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.CreateWorker(ctxT(t), req("order-1", good)); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("request id of a deleted worker: %v, want ALREADY_EXISTS", err)
	}

	// A failed create leaves the id free for the corrected request.
	if _, err := e.client.CreateWorker(ctxT(t), req("order-3", []byte("def process(:"))); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad code: %v, want INVALID_ARGUMENT", err)
	}
	fixed, err := e.client.CreateWorker(ctxT(t), req("order-3", good))
	if err != nil {
		t.Fatalf("the corrected request: %v", err)
	}
	if got := onTopic(); len(got) != 2 {
		t.Fatalf("workers on the topic %v, want order-2's and order-3's (%s)", got, fixed.GetWorkerId())
	}
}
