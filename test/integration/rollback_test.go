package integration

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Issue 14, done when: rollback to an earlier version serves that
// version's code to the next message; the history says what, who, when.
func TestRollbackWorker(t *testing.T) {
	inTurn(t) // functional, no timing assertions: runs next to the other parallel tests after the serial ones
	e := newEnvWith(t, envConfig{apiEnv: []string{"CODE_GC_GRACE=2s"}})
	in, out := topicName(t, "in"), topicName(t, "out")
	outs := e.subscribe(out)
	id := e.create(t, in, echoWorker(out, "v1"))
	if _, err := e.client.LoadCode(ctxT(t), &pb.LoadCodeRequest{WorkerId: id, Code: pyCode(echoWorker(out, "v2"))}); err != nil {
		t.Fatal(err)
	}
	e.publish(in, "before", map[string]any{"n": 1}, "")
	if d := decodeOut(t, expectEvent(t, outs, 30*time.Second).Data()); d.Version != "v2" {
		t.Fatalf("before the rollback: %+v", d)
	}

	w, err := e.client.RollbackWorker(ctxT(t), &pb.RollbackWorkerRequest{WorkerId: id, Version: 1})
	if err != nil {
		t.Fatal(err)
	}
	if w.GetCodeVersion() != 3 {
		t.Fatalf("after the rollback: code_version %d, want 3", w.GetCodeVersion())
	}
	e.publish(in, "after", map[string]any{"n": 2}, "")
	if d := decodeOut(t, expectEvent(t, outs, 30*time.Second).Data()); d.Version != "v1" || d.Input["n"] != float64(2) {
		t.Fatalf("after the rollback: %+v", d)
	}

	h, err := e.client.GetWorkerHistory(ctxT(t), &pb.GetWorkerHistoryRequest{WorkerId: id})
	if err != nil {
		t.Fatal(err)
	}
	ents := h.GetEntries()
	if len(ents) != 3 {
		t.Fatalf("history %v", ents)
	}
	for i, want := range []struct {
		action string
		to     int64
	}{{"create", 0}, {"load_code", 0}, {"rollback", 1}} {
		got := ents[i]
		if got.GetVersion() != int64(i+1) || got.GetAction() != want.action || got.GetRollbackTo() != want.to ||
			got.GetActor() != "dev" || got.GetCreatedAt().AsTime().IsZero() {
			t.Errorf("history entry %d = %v, want version %d, %s, rollback_to %d, actor dev", i, got, i+1, want.action, want.to)
		}
	}
	if ents[2].GetSha256() != ents[0].GetSha256() {
		t.Errorf("the rollback loaded %s, version 1 is %s", ents[2].GetSha256(), ents[0].GetSha256())
	}

	// Bad paths: nothing changes.
	for _, c := range []struct {
		req  *pb.RollbackWorkerRequest
		code codes.Code
		msg  string
	}{
		{&pb.RollbackWorkerRequest{WorkerId: id, Version: 9}, codes.NotFound, "has no version 9 (its versions: 1, 2, 3)"},
		{&pb.RollbackWorkerRequest{WorkerId: id, Version: 0}, codes.InvalidArgument, "version must be"},
		{&pb.RollbackWorkerRequest{WorkerId: "00000000-0000-0000-0000-000000000000", Version: 1}, codes.NotFound, ""},
	} {
		_, err := e.client.RollbackWorker(ctxT(t), c.req)
		if status.Code(err) != c.code || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("RollbackWorker(%v) = %v, want %s %q", c.req, err, c.code, c.msg)
		}
	}
	if w, err := e.client.GetWorker(ctxT(t), &pb.GetWorkerRequest{WorkerId: id}); err != nil || w.GetCodeVersion() != 3 {
		t.Fatalf("after the refused rollbacks: %v, %v", w, err)
	}

	// Deleted, its code blobs are collected after the grace period
	// (CODE_GC_GRACE=2s here); another worker's blob stays.
	other := e.create(t, topicName(t, "other"), echoWorker(out, "other"))
	ow, err := e.client.GetWorker(ctxT(t), &pb.GetWorkerRequest{WorkerId: other})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.DeleteWorker(ctxT(t), &pb.DeleteWorkerRequest{WorkerId: id}); err != nil {
		t.Fatal(err)
	}
	blob := func(sha string) bool {
		return strings.TrimSpace(e.redisCLI(t, "EXISTS", "workmanager/code/"+sha)) == "1"
	}
	waitFor(t, 30*time.Second, "the deleted worker's code blobs collected", func() bool {
		return !blob(ents[0].GetSha256()) && !blob(ents[1].GetSha256())
	})
	if !blob(ow.GetCodeSha256()) {
		t.Fatal("the other worker's code blob was collected")
	}
}
