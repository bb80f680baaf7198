package api

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/mocks"

	"github.com/virtufin/workmanager/internal/catalog"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
	"github.com/virtufin/workmanager/workflows"
)

// Issue 43 item 2: GetWorker says why a worker is not served although its
// status says RUNNING: "not recovered: <why>" while the last recovery's
// reason is recorded (until the worker loads again), next to the reasons
// of other sources.
func TestGetWorkerSaysWhyTheWorkerWasNotRecovered(t *testing.T) {
	id := "6203c8ee-cf77-4964-8144-e0bcaf0e2b6a"
	tc := mocks.NewClient(t)
	tc.On("QueryWorkflow", mock.Anything, mock.Anything, "", workflows.QueryState).Return(
		stateValue(t, workflows.WorkerState{Worker: catalog.Worker{ID: id, Topic: "orders", Status: catalog.StatusRunning, CodeVersion: 1}, Created: true}), nil)
	s, _ := newServer(t, tc)
	ctx := context.Background()
	get := func() string {
		t.Helper()
		w, err := s.GetWorker(ctx, &pb.GetWorkerRequest{WorkerId: id})
		if err != nil {
			t.Fatal(err)
		}
		return w.GetStatusReason()
	}
	if got := get(); got != "" {
		t.Fatalf("status_reason %q of a recovered worker, want none", got)
	}
	if err := s.catalog.SetNotRecovered(ctx, id, "load worker: this node cannot load me", time.Now()); err != nil {
		t.Fatal(err)
	}
	if got, want := get(), "not recovered: load worker: this node cannot load me"; got != want {
		t.Fatalf("status_reason %q, want %q", got, want)
	}
	if err := s.catalog.ClearNotRecovered(ctx, id); err != nil {
		t.Fatal(err)
	}
	if got := get(); got != "" {
		t.Fatalf("status_reason %q once the worker loaded, want none", got)
	}
}

func TestStatusReasonsCombine(t *testing.T) {
	for _, c := range []struct{ cur, add, want string }{
		{"", "", ""},
		{"", "not recovered: x", "not recovered: x"},
		{"quarantined: y", "", "quarantined: y"},
		{"not recovered: x", "quarantined: y", "not recovered: x; quarantined: y"},
		{"not recovered: x", "not recovered: x", "not recovered: x"},
	} {
		if got := addStatusReason(c.cur, c.add); got != c.want {
			t.Errorf("addStatusReason(%q, %q) = %q, want %q", c.cur, c.add, got, c.want)
		}
	}
}
