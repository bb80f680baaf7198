package api

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/mocks"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/tenant"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// A name that names no worker is NOT_FOUND by that name: the id derived
// from it (which no worker has) is not shown as if it were one.
func TestUnknownNameIsNotFoundByName(t *testing.T) {
	tc := mocks.NewClient(t)
	tc.On("QueryWorkflow", mock.Anything, mock.Anything, mock.Anything, mock.Anything).
		Return(nil, serviceerror.NewNotFound("workflow not found")).Once()
	s, _ := newServer(t, tc)
	_, err := s.GetWorker(context.Background(), &pb.GetWorkerRequest{WorkerId: "nosuch"})
	derived := NameWorkerID(tenant.Default, "nosuch")
	if status.Code(err) != codes.NotFound || status.Convert(err).Message() != `worker "nosuch" not found` || strings.Contains(err.Error(), derived) {
		t.Fatalf("get nosuch: %v; want NOT_FOUND `worker \"nosuch\" not found` without the derived id %s", err, derived)
	}
}
