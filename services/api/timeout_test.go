package api

import (
	"context"
	"testing"

	"go.temporal.io/sdk/mocks"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/catalog"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Issue 49 item 6: a worker's own timeout. CreateWorker refuses timeout_ms
// out of range, naming the field, with nothing stored; a valid one goes
// into the record, GetWorker and the create's history entry; unset stays
// unset (the node's WORKER_TIMEOUT).
func TestCreateWorkerTimeout(t *testing.T) {
	code := &pb.CodeSource{Source: &pb.CodeSource_Content{Content: []byte("def process(e): pass")}}
	for name, ms := range map[string]int64{"zero": 0, "negative": -5, "over an hour": 3600001} {
		t.Run("refused "+name, func(t *testing.T) {
			s, store := newServer(t, mocks.NewClient(t))
			_, err := s.CreateWorker(context.Background(), &pb.CreateWorkerRequest{Code: code, MimeType: engines.MIMEPython, Topic: "t", TimeoutMs: proto.Int64(ms)})
			wantCode(t, err, codes.InvalidArgument, "timeout_ms")
			if keys := store.Keys(); len(keys) != 0 {
				t.Fatalf("something was stored: %v", keys)
			}
		})
	}
	for name, ms := range map[string]*int64{"unset": nil, "5s": proto.Int64(5000), "an hour": proto.Int64(3600000)} {
		t.Run("kept "+name, func(t *testing.T) {
			s, input := serverCapturingCreate(t)
			if _, err := s.CreateWorker(context.Background(), &pb.CreateWorkerRequest{Code: code, MimeType: engines.MIMEPython, Topic: "t", TimeoutMs: ms}); err != nil {
				t.Fatal(err)
			}
			w := input().State.Worker
			want := int64(0)
			if ms != nil {
				want = *ms
			}
			if w.TimeoutMS != want {
				t.Fatalf("record timeout_ms %d, want %d", w.TimeoutMS, want)
			}
			if p := toProto(w); (p.TimeoutMs == nil) != (ms == nil) || p.GetTimeoutMs() != want {
				t.Fatalf("answered timeout_ms %v, want %v", p.TimeoutMs, ms)
			}
			if h := historyProto(catalog.HistoryEntry{Version: 1, Action: catalog.HistoryCreate, TimeoutMS: w.TimeoutMS}); h.GetTimeoutMs() != want {
				t.Fatalf("history timeout_ms %d, want %d", h.GetTimeoutMs(), want)
			}
		})
	}
}
