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

// CreateWorker refuses max_concurrency and max_processes out of range with
// INVALID_ARGUMENT naming the field, before anything is stored.
func TestCreateRefusesBadConcurrency(t *testing.T) {
	code := &pb.CodeSource{Source: &pb.CodeSource_Content{Content: []byte("async def process(e): pass")}}
	for name, c := range map[string]struct {
		conc, procs *int32
		want        string
	}{
		"zero concurrency":     {conc: proto.Int32(0), want: "max_concurrency 0 must be 1..256"},
		"too much concurrency": {conc: proto.Int32(257), want: "max_concurrency 257 must be 1..256"},
		"negative concurrency": {conc: proto.Int32(-3), want: "max_concurrency -3 must be 1..256"},
		"zero processes":       {procs: proto.Int32(0), want: "max_processes 0 must be 1..16"},
		"too many processes":   {procs: proto.Int32(17), want: "max_processes 17 must be 1..16"},
		"good conc, bad procs": {conc: proto.Int32(8), procs: proto.Int32(99), want: "max_processes 99 must be 1..16"},
	} {
		t.Run(name, func(t *testing.T) {
			s, store := newServer(t, mocks.NewClient(t))
			req := &pb.CreateWorkerRequest{Code: code, MimeType: engines.MIMEPython, Topic: "t", MaxConcurrency: c.conc, MaxProcesses: c.procs}
			_, err := s.CreateWorker(context.Background(), req)
			wantCode(t, err, codes.InvalidArgument, c.want)
			if keys := store.Keys(); len(keys) != 0 {
				t.Fatalf("something was stored: %v", keys)
			}
		})
	}
}

// Valid values go into the worker's record and are answered back; unset
// stays unset (the cluster's defaults).
func TestCreateKeepsConcurrency(t *testing.T) {
	code := &pb.CodeSource{Source: &pb.CodeSource_Content{Content: []byte("async def process(e): pass")}}
	for name, c := range map[string]struct{ conc, procs *int32 }{
		"defaults": {},
		"bounds":   {conc: proto.Int32(256), procs: proto.Int32(16)},
		"one each": {conc: proto.Int32(1), procs: proto.Int32(1)},
	} {
		t.Run(name, func(t *testing.T) {
			s, input := serverCapturingCreate(t)
			req := &pb.CreateWorkerRequest{Code: code, MimeType: engines.MIMEPython, Topic: "t", MaxConcurrency: c.conc, MaxProcesses: c.procs}
			if _, err := s.CreateWorker(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			w := input().State.Worker
			if w.MaxConcurrency != val(c.conc) || w.MaxProcesses != val(c.procs) {
				t.Fatalf("record max_concurrency %d max_processes %d, want %v %v", w.MaxConcurrency, w.MaxProcesses, c.conc, c.procs)
			}
			p := toProto(w)
			if !sameOptional(p.MaxConcurrency, c.conc) || !sameOptional(p.MaxProcesses, c.procs) {
				t.Fatalf("answered max_concurrency %v max_processes %v, want %v %v", p.MaxConcurrency, p.MaxProcesses, c.conc, c.procs)
			}
			h := historyProto(catalog.HistoryEntry{Version: 1, Action: catalog.HistoryCreate, MaxConcurrency: w.MaxConcurrency, MaxProcesses: w.MaxProcesses})
			if !sameOptional(h.MaxConcurrency, c.conc) || !sameOptional(h.MaxProcesses, c.procs) {
				t.Fatalf("history max_concurrency %v max_processes %v, want %v %v", h.MaxConcurrency, h.MaxProcesses, c.conc, c.procs)
			}
		})
	}
}

func val(p *int32) int {
	if p == nil {
		return 0
	}
	return int(*p)
}

func sameOptional(a, b *int32) bool { return (a == nil) == (b == nil) && val(a) == val(b) }
