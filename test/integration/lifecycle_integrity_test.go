package integration

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Issue 33 item 1, as a new user would try it: two concurrent CreateWorker
// calls with one name and different code (with different request ids, and
// with none) give one OK and one ALREADY_EXISTS, the loser promptly (not
// after the operation timeout), and the events are answered by the OK'd
// caller's code.
func TestConcurrentNamedCreatesRunTheAnsweredCode(t *testing.T) {
	inTurn(t) // functional, no timing assertions: runs next to the other parallel tests after the serial ones
	e := newEnv(t, "")
	const rounds = 3
	for _, withRequestIDs := range []bool{true, false} {
		for round := range rounds {
			in, out := topicName(t, fmt.Sprintf("in%d", round)), topicName(t, fmt.Sprintf("out%d", round))
			outs := e.subscribe(out)
			name := "race-" + uuid.NewString()[:8]
			type answer struct {
				version string
				id      string
				err     error
				took    time.Duration
			}
			answers := make([]answer, 2)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i, version := range []string{"a", "b"} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					req := &pb.CreateWorkerRequest{Name: name, MimeType: "text/x-python", Topic: in, Group: "g1",
						Code: &pb.CodeSource{Source: &pb.CodeSource_Content{Content: echoWorker(out, version)}}}
					if withRequestIDs {
						req.RequestId = fmt.Sprintf("%s-%s", name, version)
					}
					<-start
					began := time.Now()
					resp, err := e.client.CreateWorker(ctxT(t), req)
					answers[i] = answer{version: version, id: resp.GetWorkerId(), err: err, took: time.Since(began)}
				}()
			}
			close(start)
			wg.Wait()

			var ok *answer
			for i := range answers {
				a := &answers[i]
				switch status.Code(a.err) {
				case codes.OK:
					if ok != nil {
						t.Fatalf("request ids %v, round %d: both creates were answered OK: %+v", withRequestIDs, round, answers)
					}
					ok = a
				case codes.AlreadyExists:
					if a.took > 20*time.Second {
						t.Fatalf("request ids %v, round %d: the losing create waited %s for ALREADY_EXISTS", withRequestIDs, round, a.took)
					}
				default:
					t.Fatalf("request ids %v, round %d: create %s answered %v after %s", withRequestIDs, round, a.version, a.err, a.took)
				}
			}
			if ok == nil {
				t.Fatalf("request ids %v, round %d: no create was answered OK: %+v", withRequestIDs, round, answers)
			}
			for _, a := range answers {
				t.Logf("request ids %v, round %d: create %s answered %v after %s", withRequestIDs, round, a.version, status.Code(a.err), a.took.Round(time.Millisecond))
			}

			w, err := e.client.GetWorker(ctxT(t), &pb.GetWorkerRequest{WorkerId: ok.id})
			if err != nil || w.GetCodeVersion() != 1 || w.GetName() != name {
				t.Fatalf("worker %v, %v: want version 1 named %s", w, err, name)
			}
			e.publish(in, "m-"+uuid.NewString(), map[string]any{"round": round}, "")
			got := decodeOut(t, expectEvent(t, outs, 30*time.Second).Data())
			if got.Version != ok.version {
				t.Fatalf("request ids %v, round %d: caller %s was told OK but code %s answered the event", withRequestIDs, round, ok.version, got.Version)
			}
		}
	}
}
