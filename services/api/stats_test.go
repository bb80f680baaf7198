package api

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/mocks"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/state"
	"github.com/virtufin/workmanager/internal/workerstats"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
	"github.com/virtufin/workmanager/workflows"
)

// Issue 44 item 3: GetWorker adds what the nodes counted of the worker's
// messages, summed over the nodes (none before any node reported).
func TestGetWorkerSumsTheNodesStats(t *testing.T) {
	id := "6203c8ee-cf77-4964-8144-e0bcaf0e2b6a"
	tc := mocks.NewClient(t)
	tc.On("QueryWorkflow", mock.Anything, mock.Anything, "", workflows.QueryState).Return(
		stateValue(t, workflows.WorkerState{Worker: catalog.Worker{ID: id, Topic: "orders", Status: catalog.StatusRunning, CodeVersion: 1}, Created: true}), nil)
	store := state.NewMemoryStore()
	s := New(slog.New(slog.NewTextHandler(io.Discard, nil)), tc, catalog.New(store), engines.BuiltinMIMETypes(),
		Options{OperationTimeout: 5 * time.Second, WorkerStats: store})
	ctx := context.Background()
	w, err := s.GetWorker(ctx, &pb.GetWorkerRequest{WorkerId: id})
	if err != nil || w.GetStats() != nil {
		t.Fatalf("before any report: stats %v, %v; want none", w.GetStats(), err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	at := time.UnixMilli(1_700_000_000_000)
	n1, n2 := workerstats.NewRecorder(store, "n1", quiet), workerstats.NewRecorder(store, "n2", quiet)
	n1.Worker(id).Processed()
	n1.Worker(id).Processed()
	n1.Worker(id).Failed("worker failed: KeyError: 'price'", "o-1", at)
	n2.Worker(id).Failed("worker failed: KeyError: 'qty'", "o-2", at.Add(time.Second))
	n2.Worker(id).DeadLettered("", "", time.Time{})
	for _, r := range []*workerstats.Recorder{n1, n2} {
		if err := r.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w, err = s.GetWorker(ctx, &pb.GetWorkerRequest{WorkerId: id})
	if err != nil {
		t.Fatal(err)
	}
	st := w.GetStats()
	if st.GetProcessed() != 2 || st.GetFailed() != 2 || st.GetDeadLettered() != 1 || st.GetLastError() != "worker failed: KeyError: 'qty'" ||
		st.GetLastErrorEventId() != "o-2" || !st.GetLastErrorAt().AsTime().Equal(at.Add(time.Second)) {
		t.Fatalf("stats %v", st)
	}
}

// Issue 44 item 2: ListDeadLetters answers each dead letter's traceback;
// entries stored before tracebacks were kept still list, without one.
func TestListDeadLettersShowsTheTraceback(t *testing.T) {
	e := newDLServer(t)
	ctx := context.Background()
	// An entry as an older node stored it: no traceback field at all.
	old := []byte(`{"worker":"` + w1 + `","topic":"orders","reason":"timeout","attempts":3,"error":"boom","event_id":"o-1","source":"shop","at_ms":1}`)
	if err := e.dl.Add(ctx, deadletter.Entry{Worker: w1, Topic: "orders", Reason: "timeout", Attempts: 3, Error: "boom", EventID: "o-1", Source: "shop", AtMS: 1}); err != nil {
		t.Fatal(err)
	}
	for _, k := range e.mem.Keys() {
		if it, _ := e.mem.Get(ctx, k); strings.Contains(string(it.Value), `"event_id":"o-1"`) && strings.Contains(string(it.Value), `"worker":"`) {
			if err := e.mem.Put(ctx, k, old, state.PutOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	tb := "Traceback (most recent call last):\n  File \"<worker>\", line 7, in process\nKeyError: 'price'\n"
	if err := e.dl.Add(ctx, deadletter.Entry{Worker: w1, Topic: "orders", Reason: "worker_failed", Attempts: 3, Error: "worker failed: KeyError: 'price'",
		Traceback: tb, EventID: "o-2", Source: "shop", Event: cloudEvent("o-2"), AtMS: 2}); err != nil {
		t.Fatal(err)
	}
	resp, err := e.s.ListDeadLetters(ctx, &pb.ListDeadLettersRequest{WorkerId: w1})
	if err != nil {
		t.Fatal(err)
	}
	ds := resp.GetDeadLetters()
	if len(ds) != 2 || ds[0].GetEventId() != "o-1" || ds[0].GetTraceback() != "" || ds[1].GetEventId() != "o-2" || ds[1].GetTraceback() != tb {
		t.Fatalf("dead letters %v", ds)
	}
}
