package api

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/mocks"
	"go.temporal.io/sdk/temporal"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/catalog"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
	"github.com/virtufin/workmanager/workflows"
)

// Issue 43 item 5: a run due to continue as new refuses new updates with a
// retryable ContinueAsNewDue; the API sends the update again (to the new
// run) instead of failing the call. The refusal may come from
// UpdateWorkflow itself or from the handle.
func TestUpdateRefusedWhileContinuingAsNewIsSentAgain(t *testing.T) {
	id := "6203c8ee-cf77-4964-8144-e0bcaf0e2b6a"
	due := temporal.NewApplicationError("worker w: its workflow is continuing as new; send the update again", workflows.ContinueAsNewDue)
	for name, call := range map[string]func(*Server) error{
		"stop": func(s *Server) error {
			_, err := s.StopWorker(context.Background(), &pb.StopWorkerRequest{WorkerId: id})
			return err
		},
		"delete": func(s *Server) error {
			_, err := s.DeleteWorker(context.Background(), &pb.DeleteWorkerRequest{WorkerId: id})
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			tc := mocks.NewClient(t)
			refusedByHandle := mocks.NewWorkflowUpdateHandle(t)
			refusedByHandle.On("Get", mock.Anything, mock.Anything).Return(due).Once()
			ok := answers(t, id)
			calls := 0
			tc.On("UpdateWorkflow", mock.Anything, mock.Anything).Return(func(context.Context, client.UpdateWorkflowOptions) (client.WorkflowUpdateHandle, error) {
				calls++
				switch calls {
				case 1:
					return nil, due
				case 2:
					return refusedByHandle, nil
				}
				return ok, nil
			}).Times(3)
			s, _ := newServer(t, tc)
			if err := call(s); err != nil {
				t.Fatalf("got %v after %d updates, want the third one's answer", err, calls)
			}
		})
	}
}

// An update Temporal refuses because the run's workflow task failed (a
// node stopped or too slow while it held it: WorkflowNotReady) left no
// trace: it is sent again until it is taken.
func TestUpdateRefusedWhileTheWorkflowTaskFailedIsSentAgain(t *testing.T) {
	id := "6203c8ee-cf77-4964-8144-e0bcaf0e2b6b"
	notReady := serviceerror.NewWorkflowNotReady("Unable to perform workflow execution update due to Workflow Task in failed state.")
	tc := mocks.NewClient(t)
	ok := answers(t, id)
	calls := 0
	tc.On("UpdateWorkflow", mock.Anything, mock.Anything).Return(func(context.Context, client.UpdateWorkflowOptions) (client.WorkflowUpdateHandle, error) {
		if calls++; calls < 3 {
			return nil, fmt.Errorf("failed workflow update: %w", notReady)
		}
		return ok, nil
	}).Times(3)
	s, _ := newServer(t, tc)
	if _, err := s.StopWorker(context.Background(), &pb.StopWorkerRequest{WorkerId: id}); err != nil {
		t.Fatalf("got %v after %d updates, want the third one's answer", err, calls)
	}
	// Where it cannot be sent again, the caller is told to try again.
	if err := s.status(notReady, id); status.Code(err) != codes.Unavailable {
		t.Fatalf("WorkflowNotReady maps to %v, want UNAVAILABLE", err)
	}
}

// answers is an update handle whose one Get answers worker id, stopped.
func answers(t *testing.T, id string) *mocks.WorkflowUpdateHandle {
	h := mocks.NewWorkflowUpdateHandle(t)
	h.On("Get", mock.Anything, mock.Anything).Return(func(_ context.Context, out any) error {
		if w, isWorker := out.(*catalog.Worker); isWorker {
			*w = catalog.Worker{ID: id, Status: catalog.StatusStopped}
		}
		return nil
	}).Once()
	return h
}
