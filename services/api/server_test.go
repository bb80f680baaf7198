package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/mocks"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/failure"
	"github.com/virtufin/workmanager/internal/state"
	"github.com/virtufin/workmanager/internal/tenant"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
	"github.com/virtufin/workmanager/workflows"
)

func newServer(t *testing.T, tc client.Client) (*Server, *state.MemoryStore) {
	store := state.NewMemoryStore()
	return New(slog.New(slog.NewTextHandler(io.Discard, nil)), tc, catalog.New(store), engines.BuiltinMIMETypes(),
		Options{OperationTimeout: 5 * time.Second}), store
}

// Bad requests are refused with INVALID_ARGUMENT and a message naming what
// is wrong, before anything is staged or any workflow is touched (the mock
// client fails the test on any call).
func TestBadCreateRequestsTouchNothing(t *testing.T) {
	tc := mocks.NewClient(t)
	s, store := newServer(t, tc)
	code := &pb.CodeSource{Source: &pb.CodeSource_Content{Content: []byte("def process(e): pass")}}
	for name, c := range map[string]struct {
		req  *pb.CreateWorkerRequest
		want string
	}{
		"no topic":                {&pb.CreateWorkerRequest{Code: code, MimeType: engines.MIMEPython}, "topic is empty"},
		"reserved topic":          {&pb.CreateWorkerRequest{Code: code, MimeType: engines.MIMEPython, Topic: "workmanager.probe"}, "reserved"},
		"unknown mime":            {&pb.CreateWorkerRequest{Code: code, MimeType: "text/x-cobol", Topic: "t"}, `unknown mime_type "text/x-cobol"`},
		"no code":                 {&pb.CreateWorkerRequest{MimeType: engines.MIMEPython, Topic: "t"}, "code is required"},
		"empty code":              {&pb.CreateWorkerRequest{Code: &pb.CodeSource{Source: &pb.CodeSource_Content{}}, MimeType: engines.MIMEPython, Topic: "t"}, "code.content is empty"},
		"request id with a space": {&pb.CreateWorkerRequest{Code: code, MimeType: engines.MIMEPython, Topic: "t", RequestId: "order 1"}, `request_id has ' ' at position 5`},
		"request id too long":     {&pb.CreateWorkerRequest{Code: code, MimeType: engines.MIMEPython, Topic: "t", RequestId: strings.Repeat("r", 129)}, "request_id is 129 characters long"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := s.CreateWorker(context.Background(), c.req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want INVALID_ARGUMENT containing %q", err, c.want)
			}
		})
	}
	if keys := store.Keys(); len(keys) != 0 {
		t.Fatalf("something was stored: %v", keys)
	}
}

// A malformed worker id is answered without asking Temporal.
func TestMalformedWorkerIDs(t *testing.T) {
	s, _ := newServer(t, mocks.NewClient(t))
	if _, err := s.StopWorker(context.Background(), &pb.StopWorkerRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("empty id: %v", err)
	}
	if _, err := s.StopWorker(context.Background(), &pb.StopWorkerRequest{WorkerId: "Not_A_UUID"}); status.Code(err) != codes.NotFound {
		t.Fatalf("malformed id: %v", err)
	}
}

// A worker name stands for the worker id derived from it, in every RPC.
func TestNamesResolveToTheirWorkerID(t *testing.T) {
	tc := mocks.NewClient(t)
	want := NameWorkerID(tenant.Default, "orders-enricher")
	tc.On("UpdateWorkflow", mock.Anything, mock.MatchedBy(func(o client.UpdateWorkflowOptions) bool {
		return o.WorkflowID == workflows.WorkflowID(want)
	})).Return(nil, failure.New(failure.NotFound, "worker is deleted")).Once()
	s, _ := newServer(t, tc)
	if _, err := s.StopWorker(context.Background(), &pb.StopWorkerRequest{WorkerId: "orders-enricher"}); status.Code(err) != codes.NotFound ||
		!strings.Contains(err.Error(), `"orders-enricher"`) {
		t.Fatalf("stop by name: %v", err)
	}
}

func TestBadNamesAreRefused(t *testing.T) {
	s, store := newServer(t, mocks.NewClient(t))
	code := &pb.CodeSource{Source: &pb.CodeSource_Content{Content: []byte("def process(e): pass")}}
	for name, want := range map[string]string{
		"Upper":                                "has 'U'",
		"9lives":                               "must start with a letter",
		"trailing-":                            "must not end with",
		"a" + strings.Repeat("b", 63):          "1 to 63 characters",
		"abcdef01-2345-6789-abcd-ef0123456789": "shaped like a worker id",
	} {
		_, err := s.CreateWorker(context.Background(), &pb.CreateWorkerRequest{Code: code, MimeType: engines.MIMEPython, Topic: "t", Name: name})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), want) {
			t.Fatalf("name %q: got %v, want INVALID_ARGUMENT containing %q", name, err, want)
		}
	}
	if keys := store.Keys(); len(keys) != 0 {
		t.Fatalf("something was stored: %v", keys)
	}
}

// Each application error type that crosses Temporal becomes its gRPC code.
func TestUpdateErrorsBecomeGRPCCodes(t *testing.T) {
	id := "6203c8ee-cf77-4964-8144-e0bcaf0e2b6a"
	for name, c := range map[string]struct {
		err  error
		code codes.Code
		msg  string
	}{
		"invalid":        {fmt.Errorf("update: %w", failure.New(failure.InvalidArgument, "SyntaxError: invalid syntax")), codes.InvalidArgument, "SyntaxError"},
		"not found":      {failure.New(failure.NotFound, "worker is deleted"), codes.NotFound, "not found"},
		"already exists": {failure.New(failure.AlreadyExists, "exists"), codes.AlreadyExists, "already exists"},
		"no workflow":    {serviceerror.NewNotFound("workflow execution already completed"), codes.NotFound, "not found"},
		"deadline":       {context.DeadlineExceeded, codes.DeadlineExceeded, "did not finish in time"},
		"other":          {errors.New("history service unavailable"), codes.Internal, "history service unavailable"},
	} {
		t.Run(name, func(t *testing.T) {
			tc := mocks.NewClient(t)
			tc.On("UpdateWorkflow", mock.Anything, mock.Anything).Return(nil, c.err).Once()
			s, _ := newServer(t, tc)
			_, err := s.StopWorker(context.Background(), &pb.StopWorkerRequest{WorkerId: id})
			if status.Code(err) != c.code || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("got %v, want %s containing %q", err, c.code, c.msg)
			}
		})
	}
}
