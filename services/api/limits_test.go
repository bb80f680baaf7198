package api

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"
	"go.temporal.io/sdk/mocks"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/auth"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/tenant"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// ListWorkers pages by id through the caller's tenant's workers only; bad
// page sizes and tokens are INVALID_ARGUMENT.
func TestListWorkersPages(t *testing.T) {
	s, store := newServer(t, mocks.NewClient(t))
	cat := catalog.New(store)
	ctx := context.Background()
	want := map[string]bool{}
	for i := range 7 {
		tn := "acme"
		if i%3 == 0 {
			tn = "globex"
		}
		w := catalog.Worker{ID: tenant.WorkerID(tn, uuid.New()), Tenant: tn, Topic: fmt.Sprint(tn, ".t"), MIMEType: "text/x-python"}
		if err := cat.SaveWorker(ctx, w); err != nil {
			t.Fatal(err)
		}
		if tn == "acme" {
			want[w.ID] = true
		}
	}
	acme := as(auth.RoleReader, "acme")
	got, token, pages := map[string]bool{}, "", 0
	for {
		resp, err := s.ListWorkers(acme, &pb.ListWorkersRequest{PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(resp.GetWorkers()) > 2 {
			t.Fatalf("page of %d", len(resp.GetWorkers()))
		}
		for _, w := range resp.GetWorkers() {
			if got[w.GetWorkerId()] || w.GetTenant() != "acme" {
				t.Fatalf("worker %s (%s) again or of another tenant", w.GetWorkerId(), w.GetTenant())
			}
			got[w.GetWorkerId()] = true
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	if len(got) != len(want) || pages != 2 {
		t.Fatalf("%d workers in %d pages, want %d in 2", len(got), pages, len(want))
	}
	for _, c := range []struct {
		req  *pb.ListWorkersRequest
		want string
	}{
		{&pb.ListWorkersRequest{PageSize: -1}, "page_size -1"},
		{&pb.ListWorkersRequest{PageSize: 1001}, "page_size 1001"},
		{&pb.ListWorkersRequest{PageToken: "not base64!"}, "page_token"},
	} {
		if _, err := s.ListWorkers(acme, c.req); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v", c.req, err)
		}
	}
}

// Inline code over the configured maximum and malformed dead-letter
// reasons are refused before anything is touched.
func TestRequestLimits(t *testing.T) {
	s, store := newServer(t, mocks.NewClient(t))
	s.opts.MaxCodeBytes = 10
	_, err := s.CreateWorker(context.Background(), &pb.CreateWorkerRequest{MimeType: "text/x-python", Topic: "orders",
		Code: &pb.CodeSource{Source: &pb.CodeSource_Content{Content: []byte("01234567890")}}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "11 bytes, more than API_MAX_CODE_BYTES 10") {
		t.Fatalf("oversized code: %v", err)
	}
	if keys := store.Keys(); len(keys) != 0 {
		t.Fatalf("keys written: %v", keys)
	}
	for _, r := range []string{"Timeout", "worker failed", strings.Repeat("a", 65)} {
		if err := validReason(r); status.Code(err) != codes.InvalidArgument {
			t.Errorf("reason %q: %v", r, err)
		}
	}
	if err := validReason("lock_contention"); err != nil {
		t.Error(err)
	}
}
