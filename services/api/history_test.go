package api

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/mocks"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/virtufin/workmanager/internal/catalog"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
	"github.com/virtufin/workmanager/workflows"
)

// historyServer serves a worker whose history has n versions, each a URL
// load with a URL of the longest length the API takes.
func historyServer(t *testing.T, id string, n int64) *Server {
	t.Helper()
	tc := mocks.NewClient(t)
	tc.On("QueryWorkflow", mock.Anything, mock.Anything, "", workflows.QueryState).Return(
		stateValue(t, workflows.WorkerState{Created: true, Worker: catalog.Worker{ID: id, CodeVersion: n}}), nil).Maybe()
	s, _ := newServer(t, tc)
	ctx := context.Background()
	url := "https://code.example/" + strings.Repeat("p", 2048-len("https://code.example/"))
	for v := int64(1); v <= n; v++ {
		e := catalog.HistoryEntry{Version: v, SHA256: fmt.Sprintf("%064x", v), SourceKind: "url", URL: url,
			CreatedAt: time.Unix(1_700_000_000+v, 0).UTC(), Actor: strings.Repeat("a", 64), Action: catalog.HistoryLoadCode, Revision: v}
		if err := s.catalog.AppendHistory(ctx, id, e); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.catalog.SaveWorker(ctx, catalog.Worker{ID: id, CodeVersion: n, CodeSHA256: fmt.Sprintf("%064x", n), Revision: n}); err != nil {
		t.Fatal(err)
	}
	return s
}

// Issue 43 item 6: a history of 3,000 versions with 2 KiB URLs (6.4 MB as
// one answer, over gRPC's default 4 MiB client limit) is answered in pages
// of at most 1,000 entries, each under 4 MiB, oldest first.
func TestGetWorkerHistoryPages(t *testing.T) {
	const id = "9b0c3f52-8a3e-4d55-9bd2-0f4f3c1f7a10"
	s := historyServer(t, id, 3000)
	ctx := context.Background()
	var got []int64
	var sizes []int
	tok := ""
	for range 10 {
		resp, err := s.GetWorkerHistory(ctx, &pb.GetWorkerHistoryRequest{WorkerId: id, PageToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		if n := proto.Size(resp); n >= 4<<20 {
			t.Fatalf("a page of %d entries is %d bytes, over gRPC's 4 MiB default", len(resp.GetEntries()), n)
		}
		sizes = append(sizes, len(resp.GetEntries()))
		for _, e := range resp.GetEntries() {
			got = append(got, e.GetVersion())
		}
		if tok = resp.GetNextPageToken(); tok == "" {
			break
		}
	}
	if fmt.Sprint(sizes) != "[1000 1000 1000]" {
		t.Fatalf("pages of %v entries, want [1000 1000 1000]", sizes)
	}
	for i, v := range got {
		if v != int64(i+1) {
			t.Fatalf("entry %d is version %d, want oldest first", i, v)
		}
	}

	// A page size of 7: 7 entries and a token, the last page without one.
	resp, err := s.GetWorkerHistory(ctx, &pb.GetWorkerHistoryRequest{WorkerId: id, PageSize: 7})
	if err != nil || len(resp.GetEntries()) != 7 || resp.GetEntries()[6].GetVersion() != 7 || resp.GetNextPageToken() == "" {
		t.Fatalf("page of 7: %d entries, token %q, %v", len(resp.GetEntries()), resp.GetNextPageToken(), err)
	}
	resp, err = s.GetWorkerHistory(ctx, &pb.GetWorkerHistoryRequest{WorkerId: id, PageSize: 7, PageToken: resp.GetNextPageToken()})
	if err != nil || len(resp.GetEntries()) != 7 || resp.GetEntries()[0].GetVersion() != 8 {
		t.Fatalf("second page of 7: %v, %v", resp.GetEntries(), err)
	}
	resp, err = s.GetWorkerHistory(ctx, &pb.GetWorkerHistoryRequest{WorkerId: id, PageSize: 5, PageToken: historyToken(2995, id)})
	if err != nil || len(resp.GetEntries()) != 5 || resp.GetNextPageToken() != "" {
		t.Fatalf("last page: %d entries, token %q, %v", len(resp.GetEntries()), resp.GetNextPageToken(), err)
	}
}

func TestGetWorkerHistoryRefusesBadPageSizesAndTokens(t *testing.T) {
	const id = "9b0c3f52-8a3e-4d55-9bd2-0f4f3c1f7a10"
	const other = "2d7e9d1e-5f0c-4f7e-a1b4-6c1b8e0f9a22"
	s := historyServer(t, id, 3)
	ctx := context.Background()
	for _, c := range []struct {
		name string
		req  *pb.GetWorkerHistoryRequest
		msg  string
	}{
		{"page size over the maximum", &pb.GetWorkerHistoryRequest{WorkerId: id, PageSize: 1001}, "page_size 1001 must be 0 (default 1000) or 1..1000"},
		{"negative page size", &pb.GetWorkerHistoryRequest{WorkerId: id, PageSize: -1}, "page_size -1"},
		{"not base64", &pb.GetWorkerHistoryRequest{WorkerId: id, PageToken: "!!!"}, "page_token is not a token this API returned"},
		{"a ListWorkers token", &pb.GetWorkerHistoryRequest{WorkerId: id, PageToken: base64.RawURLEncoding.EncodeToString([]byte(id))}, "page_token"},
		{"another worker's token", &pb.GetWorkerHistoryRequest{WorkerId: id, PageToken: historyToken(1, other)}, "page_token"},
		{"version 0", &pb.GetWorkerHistoryRequest{WorkerId: id, PageToken: historyToken(0, id)}, "page_token"},
		{"not a number", &pb.GetWorkerHistoryRequest{WorkerId: id, PageToken: base64.RawURLEncoding.EncodeToString([]byte("h1/x/" + id))}, "page_token"},
		{"too long", &pb.GetWorkerHistoryRequest{WorkerId: id, PageToken: strings.Repeat("A", 1000)}, "page_token"},
	} {
		_, err := s.GetWorkerHistory(ctx, c.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT containing %q", c.name, err, c.msg)
		}
	}
	// A token past the end is a last, empty page.
	resp, err := s.GetWorkerHistory(ctx, &pb.GetWorkerHistoryRequest{WorkerId: id, PageToken: historyToken(3, id)})
	if err != nil || len(resp.GetEntries()) != 0 || resp.GetNextPageToken() != "" {
		t.Fatalf("past the end: %v %v", resp, err)
	}
}

// A rollback to a version the history lacks names the versions it has,
// also for a history too long to list.
func TestRollbackToAMissingVersionListsTheVersions(t *testing.T) {
	const id = "9b0c3f52-8a3e-4d55-9bd2-0f4f3c1f7a10"
	for n, want := range map[int64]string{3: "(its versions: 1, 2, 3)", 25: "(its versions: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, …, 25)"} {
		s := historyServer(t, id, n)
		_, err := s.RollbackWorker(context.Background(), &pb.RollbackWorkerRequest{WorkerId: id, Version: 99})
		if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "has no version 99 "+want) {
			t.Fatalf("%d versions: %v, want NOT_FOUND with %q", n, err, want)
		}
	}
}

// Entries with long actors (a JWT subject is not bounded by the API) end a
// page before 1,000 entries: no answer passes gRPC's 4 MiB default, and the
// next page goes on where it ended.
func TestGetWorkerHistoryPageStopsUnder4MiB(t *testing.T) {
	const id = "9b0c3f52-8a3e-4d55-9bd2-0f4f3c1f7a10"
	tc := mocks.NewClient(t)
	tc.On("QueryWorkflow", mock.Anything, mock.Anything, "", workflows.QueryState).Return(
		stateValue(t, workflows.WorkerState{Created: true, Worker: catalog.Worker{ID: id, CodeVersion: 1000}}), nil).Maybe()
	s, _ := newServer(t, tc)
	ctx := context.Background()
	for v := int64(1); v <= 1000; v++ {
		if err := s.catalog.AppendHistory(ctx, id, catalog.HistoryEntry{Version: v, SHA256: fmt.Sprintf("%064x", v), SourceKind: "content",
			Actor: strings.Repeat("s", 8<<10), Revision: v}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.catalog.SaveWorker(ctx, catalog.Worker{ID: id, CodeVersion: 1000, Revision: 1000}); err != nil {
		t.Fatal(err)
	}
	var total int
	tok := ""
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatal("more than 10 pages")
		}
		resp, err := s.GetWorkerHistory(ctx, &pb.GetWorkerHistoryRequest{WorkerId: id, PageToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		if n := proto.Size(resp); n >= 4<<20 {
			t.Fatalf("a page is %d bytes", n)
		}
		if pages == 0 && len(resp.GetEntries()) == 1000 {
			t.Fatal("8 MiB of entries in one page")
		}
		for _, e := range resp.GetEntries() {
			total++
			if e.GetVersion() != int64(total) {
				t.Fatalf("entry %d is version %d", total, e.GetVersion())
			}
		}
		if tok = resp.GetNextPageToken(); tok == "" {
			break
		}
	}
	if total != 1000 {
		t.Fatalf("%d entries in all, want 1000", total)
	}
}
