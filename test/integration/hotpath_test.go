package integration

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/dispatch"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// The hot path's integrity on the real stack (issue 30, "No message lost,
// no group shared").

// Issue 30, item 3: a 3 MiB event — above MAX_EVENT_BYTES (1 MiB) and
// the old gRPC receive limit (MAX_EVENT_BYTES + 1 MiB), below daprd's max
// body — is dead-lettered once as too_large; small events on the same
// topic keep being answered within seconds and the node stays ready. The
// worker's own code is 3 MiB too: the node reads it from the state store
// over the same connection.
func TestOversizeEventDeadLettersAndTopicFlows(t *testing.T) {
	e := newEnv(t, "")
	in, out := topicName(t, "in"), topicName(t, "out")
	dead := collectFrom(e.subscribe(in + dispatch.DeadLetterSuffix))
	o := &outputs{t: t, ch: e.subscribe(out), seen: map[string]bool{}}
	code := append(echoWorker(out, "v1"), []byte("\n# "+strings.Repeat("p", 3<<20)+"\n")...)
	e.createWith(t, &pb.CreateWorkerRequest{Code: pyCode(code), MimeType: "text/x-python", Topic: in})
	e.publish(in, "before", map[string]any{"n": 0}, "")
	o.expect("before")

	e.publish(in, "huge", map[string]any{"blob": strings.Repeat("x", 3<<20)}, "")
	began := time.Now()
	var ids []string
	for i := range 15 {
		id := fmt.Sprintf("small-%d", i)
		ids = append(ids, id)
		e.publish(in, id, map[string]any{"n": i}, "")
	}
	o.expect(ids...)
	if took := time.Since(began); took > 5*time.Second {
		t.Fatalf("15 small events after a 3 MiB one took %s", took)
	}
	waitFor(t, 30*time.Second, "the 3 MiB event on "+in+dispatch.DeadLetterSuffix, func() bool { return len(dead.get("huge")) > 0 })
	// Past the processing timeout (6 s) and a redelivery scan: had it not
	// been acked, it would be dead-lettered again.
	time.Sleep(9 * time.Second)
	evs := dead.get("huge")
	if len(evs) != 1 || evs[0].Extensions()[dispatch.DeadLetterReasonExtension] != "too_large" {
		t.Fatalf("dead letters of the 3 MiB event: %v", evs)
	}
	if fmt.Sprint(evs[0].Extensions()[dispatch.DeadLetterTruncatedExtension]) == "" || len(evs[0].Data()) > 1<<20 {
		t.Fatalf("dead letter carries %d bytes, truncated %v", len(evs[0].Data()), evs[0].Extensions()[dispatch.DeadLetterTruncatedExtension])
	}
	e.publish(in, "after", map[string]any{"n": 99}, "")
	o.expect("after")
	if code, body := e.readyz(t); code != http.StatusOK {
		t.Fatalf("/readyz %d: %s", code, body)
	}
}
