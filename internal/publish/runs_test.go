package publish_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"
	dapr "github.com/dapr/go-sdk/client"
	"google.golang.org/grpc"

	"github.com/virtufin/workmanager/internal/publish"
	"github.com/virtufin/workmanager/internal/publish/publishtest"
)

// rawDapr answers BulkPublishEventAlpha1 as daprd does for a request of
// fenced runs: failed entries with the component's error text, or an
// error for the whole request.
type rawDapr struct {
	runtimev1.DaprClient
	got    *runtimev1.BulkPublishRequest
	failed []*runtimev1.BulkPublishResponseFailedEntry
	err    error
}

func (r *rawDapr) BulkPublishEventAlpha1(_ context.Context, in *runtimev1.BulkPublishRequest, _ ...grpc.CallOption) (*runtimev1.BulkPublishResponse, error) {
	r.got = in
	if r.err != nil {
		return nil, r.err
	}
	return &runtimev1.BulkPublishResponse{FailedEntries: r.failed}, nil
}

type rawClient struct {
	publishtest.DaprClient
	raw *rawDapr
}

func (c *rawClient) GrpcClient() runtimev1.DaprClient { return c.raw }

var _ dapr.Client = (*rawClient)(nil)

// PublishFencedRuns sends every run's entries with their lock and token
// in one request, and reads daprd's failed entries back per run: the
// fence's refusal as ErrFenced, anything else as it is, a failed request
// as one error.
func TestDaprPublishFencedRunsReadsEachRunsAnswer(t *testing.T) {
	raw := &rawDapr{failed: []*runtimev1.BulkPublishResponseFailedEntry{
		{EntryId: "1/0", Error: "WMFENCED token 5 of g is below the lock's mark on out, already published"},
		{EntryId: "1/1", Error: "WMFENCED token 5 of g is below the lock's mark on out, already published"},
		{EntryId: "2/0", Error: "OOM command not allowed"},
	}}
	p := publish.NewDapr(&rawClient{raw: raw}, "pubsub")
	p.MaxLen = 100000
	runs := []publish.FencedRun{
		{Lock: "out|k1", Events: []*event.Event{fencedEv("a", 3)}},
		{Lock: "out|g", Events: []*event.Event{fencedEv("b", 5), fencedEv("c", 6)}},
		{Lock: "out|k2", Events: []*event.Event{fencedEv("d", 1)}},
	}
	errs, err := p.PublishFencedRuns(context.Background(), "out", runs)
	if err != nil {
		t.Fatal(err)
	}
	if errs[0] != nil || !errors.Is(errs[1], publish.ErrFenced) || errs[2] == nil || errors.Is(errs[2], publish.ErrFenced) {
		t.Fatalf("per-run errors %v", errs)
	}
	if n := len(raw.got.GetEntries()); n != 4 || raw.got.GetTopic() != "out" || raw.got.GetPubsubName() != "pubsub" {
		t.Fatalf("sent %d entries to %s/%s", n, raw.got.GetPubsubName(), raw.got.GetTopic())
	}
	for i, want := range []struct{ lock, tok string }{{"out|k1", "3"}, {"out|g", "5"}, {"out|g", "6"}, {"out|k2", "1"}} {
		m := raw.got.GetEntries()[i].GetMetadata()
		if m["fenceLock"] != want.lock || m["fenceToken"] != want.tok || m["maxLenApprox"] != "100000" {
			t.Fatalf("entry %d metadata %v, want lock %s token %s and the cap", i, m, want.lock, want.tok)
		}
		if ct := raw.got.GetEntries()[i].GetContentType(); ct != publish.ContentType {
			t.Fatalf("entry %d content type %q", i, ct)
		}
	}

	raw.err = errors.New("rpc error: code = Unavailable")
	if _, err := p.PublishFencedRuns(context.Background(), "out", runs); err == nil || !strings.Contains(err.Error(), "Unavailable") {
		t.Fatalf("a failed request: %v", err)
	}
	raw.err, raw.failed = nil, []*runtimev1.BulkPublishResponseFailedEntry{{EntryId: "7/0", Error: "x"}}
	if _, err := p.PublishFencedRuns(context.Background(), "out", runs); err == nil {
		t.Fatal("a failed entry that was not sent was taken")
	}
	if _, err := p.PublishFencedRuns(context.Background(), "out", []publish.FencedRun{{Lock: "", Events: runs[0].Events}}); err == nil {
		t.Fatal("a run without a lock was sent")
	}
}
