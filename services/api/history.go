package api

import (
	"context"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/virtufin/workmanager/internal/catalog"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// maxHistoryAnswerBytes bounds the entries of one GetWorkerHistory answer,
// under gRPC's default 4 MiB client limit whatever the entries hold (a
// page of MaxHistoryPage entries with 2 KiB URLs is about 2.2 MB; a page
// that would pass this ends early, with a next_page_token).
const maxHistoryAnswerBytes = 3 << 20

// historyTokenPrefix starts every history page token (base64url of
// "h1/<last version returned>/<worker id>").
const historyTokenPrefix = "h1/"

// GetWorkerHistory implements pb.WorkManagerServiceServer: the worker's
// code versions, oldest first, in pages of page_size entries (0: the
// maximum, catalog.MaxHistoryPage); next_page_token is set when there are
// more.
func (s *Server) GetWorkerHistory(ctx context.Context, req *pb.GetWorkerHistoryRequest) (*pb.GetWorkerHistoryResponse, error) {
	id, display, err := resolve(ctx, req.GetWorkerId())
	if err != nil {
		return nil, err
	}
	size := int(req.GetPageSize())
	switch {
	case size == 0:
		size = catalog.MaxHistoryPage
	case size < 0 || size > catalog.MaxHistoryPage:
		return nil, status.Errorf(codes.InvalidArgument, "page_size %d must be 0 (default %d) or 1..%d; page through longer histories with next_page_token",
			size, catalog.MaxHistoryPage, catalog.MaxHistoryPage)
	}
	after, err := parseHistoryToken(req.GetPageToken(), id)
	if err != nil {
		return nil, err
	}
	if _, err := s.state(ctx, id); err != nil {
		return nil, named(err, display)
	}
	entries, next, err := s.catalog.HistoryPage(ctx, id, after, size)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "reading the history of %s: %v", display, err)
	}
	out := &pb.GetWorkerHistoryResponse{Entries: make([]*pb.HistoryEntry, 0, len(entries))}
	used := 0
	for _, e := range entries {
		pe := historyProto(e)
		n := proto.Size(pe) + 8 // with its field tag and length
		if len(out.Entries) > 0 && used+n > maxHistoryAnswerBytes {
			next = out.Entries[len(out.Entries)-1].GetVersion()
			break
		}
		used += n
		out.Entries = append(out.Entries, pe)
	}
	if next > 0 {
		out.NextPageToken = historyToken(next, id)
	}
	return out, nil
}

func historyProto(e catalog.HistoryEntry) *pb.HistoryEntry {
	action := e.Action
	if action == "" { // entries from before actions were recorded
		action = catalog.HistoryLoadCode
		if e.Version == 1 {
			action = catalog.HistoryCreate
		}
	}
	out := &pb.HistoryEntry{Version: e.Version, Sha256: e.SHA256, SourceKind: e.SourceKind,
		Url: e.URL, CreatedAt: timestamppb.New(e.CreatedAt), Actor: e.Actor, Action: action, RollbackTo: e.RollbackTo}
	if p := e.Placement; p != nil {
		var w pb.Worker
		placementProto(&w, catalog.Worker{Placement: p})
		out.Replicas, out.Placement = w.Replicas, w.Placement
	}
	out.MaxConcurrency, out.MaxProcesses = optionalInt32(e.MaxConcurrency), optionalInt32(e.MaxProcesses)
	out.TimeoutMs = optionalInt64(e.TimeoutMS)
	out.GroupKey = e.GroupKey
	return out
}

func historyToken(after int64, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(historyTokenPrefix + strconv.FormatInt(after, 10) + "/" + id))
}

// parseHistoryToken is the version a page token continues after (0 for
// no token); a token this API did not return for worker id is refused.
func parseHistoryToken(tok, id string) (int64, error) {
	if tok == "" {
		return 0, nil
	}
	bad := status.Error(codes.InvalidArgument, "page_token is not a token this API returned for this worker's history (pass next_page_token as it came, with the same worker_id)")
	if len(tok) > 400 {
		return 0, bad
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return 0, bad
	}
	rest, ok := strings.CutPrefix(string(b), historyTokenPrefix)
	if !ok {
		return 0, bad
	}
	v, tokID, ok := strings.Cut(rest, "/")
	if !ok || tokID != id {
		return 0, bad
	}
	after, err := strconv.ParseInt(v, 10, 64)
	if err != nil || after < 1 || strconv.FormatInt(after, 10) != v {
		return 0, bad
	}
	return after, nil
}

// noSuchVersion is the NOT_FOUND of a rollback to a version the history
// does not show, listing the versions it has (the first ones and the last
// of a long history).
func (s *Server) noSuchVersion(ctx context.Context, id, display string, v int64) error {
	const listed = 20
	entries, next, err := s.catalog.HistoryPage(ctx, id, 0, listed)
	if err != nil {
		return status.Errorf(codes.NotFound, "worker %s has no version %d", display, v)
	}
	versions := make([]string, 0, len(entries)+2)
	for _, e := range entries {
		versions = append(versions, strconv.FormatInt(e.Version, 10))
	}
	if next > 0 {
		if w, err := s.catalog.GetWorker(ctx, id); err == nil {
			versions = append(versions, "…", strconv.FormatInt(w.CodeVersion, 10))
		}
	}
	return status.Error(codes.NotFound, fmt.Sprintf("worker %s has no version %d (its versions: %s)", display, v, strings.Join(versions, ", ")))
}
