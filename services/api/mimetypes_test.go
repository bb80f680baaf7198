package api

import (
	"context"
	"testing"
	"time"

	"go.temporal.io/sdk/mocks"
	"google.golang.org/grpc/codes"

	"github.com/virtufin/workmanager/internal/cluster"
	"github.com/virtufin/workmanager/internal/placement"
	"github.com/virtufin/workmanager/internal/state"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Issue 49 item 7: an engine registered outside engines/builtin (here a
// node advertising "application/x-test-engine") is accepted by CreateWorker
// by its MIME type; one no live node advertises is refused naming the
// supported ones, and a node that is gone no longer counts.
func TestCreateAcceptsAMIMETypeANodeAdvertises(t *testing.T) {
	ctx := context.Background()
	const custom = "application/x-test-engine"
	code := &pb.CodeSource{Source: &pb.CodeSource_Content{Content: []byte("anything")}}
	cl := state.NewMemoryStore()
	if err := cluster.New(cl, "n1", time.Minute).Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if err := placement.NewStore(cl).Advertise(ctx, placement.NodeInfo{ID: "n1", Engines: []string{"test"}, MIMETypes: []string{custom}}, time.Minute); err != nil {
		t.Fatal(err)
	}
	// Advertised by a node that is not alive: not accepted.
	if err := placement.NewStore(cl).Advertise(ctx, placement.NodeInfo{ID: "gone", MIMETypes: []string{"application/x-gone"}}, time.Minute); err != nil {
		t.Fatal(err)
	}

	s, input := serverCapturingCreate(t)
	s.opts.Cluster, s.opts.NodeTTL = cl, time.Minute
	if _, err := s.CreateWorker(ctx, &pb.CreateWorkerRequest{Code: code, MimeType: custom, Topic: "t"}); err != nil {
		t.Fatalf("CreateWorker(%s): %v", custom, err)
	}
	if got := input().State.Worker.MIMEType; got != custom {
		t.Fatalf("record MIME type %q, want %q", got, custom)
	}

	refusing, _ := newServer(t, mocks.NewClient(t))
	refusing.opts.Cluster, refusing.opts.NodeTTL = cl, time.Minute
	for _, mime := range []string{"application/x-gone", "application/x-nobody"} {
		_, err := refusing.CreateWorker(ctx, &pb.CreateWorkerRequest{Code: code, MimeType: mime, Topic: "t"})
		wantCode(t, err, codes.InvalidArgument, `unknown mime_type "`+mime+`"`)
		wantCode(t, err, codes.InvalidArgument, custom) // the supported list names it
	}
}
