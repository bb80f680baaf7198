package api

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/mocks"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/failure"
	"github.com/virtufin/workmanager/internal/state"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
	"github.com/virtufin/workmanager/workflows"
)

// Issue 43 item 4: a create with a request id and code that does not
// compile failed in its first run, whose PrepareCode dropped the staged
// upload; the API then tries again in a new run (the failure might have
// been an earlier request's), and that run answered "uploaded code …
// expired … send it again" instead of the compile error, every time. The
// fake Temporal here does what PrepareCode does with the staging area.
func TestRequestIDCreateWithBadCodeAnswersTheCompileError(t *testing.T) {
	tc := mocks.NewClient(t)
	tc.On("NewWithStartWorkflowOperation", mock.Anything, mock.Anything, mock.Anything).Return(nil)
	var s *Server
	creates := 0
	tc.On("UpdateWithStartWorkflow", mock.Anything, mock.Anything).Return(func(ctx context.Context, o client.UpdateWithStartWorkflowOptions) (client.WorkflowUpdateHandle, error) {
		creates++
		sha := o.UpdateOptions.Args[0].(workflows.CreateRequest).Ref.SHA256
		if _, err := s.catalog.GetStaged(ctx, sha); errors.Is(err, state.ErrNotFound) {
			return nil, failure.New(failure.InvalidArgument, "uploaded code "+sha+" expired before it was loaded; send it again")
		}
		_ = s.catalog.DeleteStaged(ctx, sha) // the code is refused: the upload is dropped
		return nil, failure.New(failure.InvalidArgument, "SyntaxError: invalid syntax (line 1)")
	})
	closed := mocks.NewWorkflowRun(t)
	closed.On("Get", mock.Anything, mock.Anything).Return(errors.New("create failed")).Maybe()
	tc.On("GetWorkflow", mock.Anything, mock.Anything, "").Return(closed).Maybe()
	s, _ = newServer(t, tc)
	_, err := s.CreateWorker(context.Background(), &pb.CreateWorkerRequest{RequestId: "r-bad", MimeType: engines.MIMEPython, Topic: "t",
		Code: &pb.CodeSource{Source: &pb.CodeSource_Content{Content: []byte("def process(e) return None")}}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "SyntaxError") {
		t.Fatalf("got %v after %d creates, want INVALID_ARGUMENT with the compile error", err, creates)
	}
}
