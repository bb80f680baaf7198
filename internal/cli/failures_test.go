package cli

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/virtufin/workmanager/internal/lifecycleevents"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

const pyTraceback = "Traceback (most recent call last):\n" +
	"  File \"<worker>\", line 12, in process\n    return price(event[\"data\"])\n" +
	"  File \"<worker>\", line 7, in price\n    total += item[\"price\"] * item[\"qty\"]\n" +
	"KeyError: 'price'\n"

func TestLastFrame(t *testing.T) {
	for tb, want := range map[string]string{
		pyTraceback: "<worker>:7 in price",
		"System.NullReferenceException: Object reference not set to an instance of an object\n" +
			"  at Pricer.ProcessAsync (Virtufin.Worker.CloudEvent input) [0x00000] in <0f733092f4184a17b40828726de09782>:0 \n" +
			"  at Pricer.Outer () [0x00001] in <0f733092f4184a17b40828726de09782>:0 ": "Pricer.ProcessAsync",
		"System.InvalidOperationException: boom\n   at Pricer.ProcessAsync(CloudEvent input) in /src/Pricer.cs:line 12": "Pricer.ProcessAsync in /src/Pricer.cs:12",
		"price missing in item 3\n": "price missing in item 3",
		"":                          "",
	} {
		if got := lastFrame(tb); got != want {
			t.Errorf("lastFrame(%q) = %q, want %q", tb, got, want)
		}
	}
}

// Issue 44 item 2: dead-letters shows where each dead letter failed (the
// traceback's innermost frame) in the table, and the whole traceback with
// -o json.
func TestDeadLettersShowWhereTheyFailed(t *testing.T) {
	f := startFake(t, nil)
	f.deadLetters = []*pb.DeadLetter{{WorkerId: "w-1", Topic: "orders", Reason: "worker_failed", Attempts: 3, Error: "worker failed: KeyError: 'price'",
		EventId: "o-2", Source: "shop", At: fixedTime, Traceback: pyTraceback}}
	out := f.runOK(t, "dead-letters", "w-1")
	if lines := strings.Split(out, "\n"); !strings.Contains(lines[0], "LAST FRAME") || !strings.Contains(lines[1], "<worker>:7 in price") ||
		!strings.Contains(lines[1], "KeyError: 'price'") {
		t.Errorf("table:\n%s", out)
	}
	var ds []map[string]any
	if err := json.Unmarshal([]byte(f.runOK(t, "dead-letters", "w-1", "-o", "json")), &ds); err != nil || len(ds) != 1 || ds[0]["traceback"] != pyTraceback {
		t.Errorf("-o json: %v %v", ds, err)
	}
}

// dead-letters --wait prints the next dead letter that was not stored when
// it started, and exits 6 when none comes within --timeout.
func TestDeadLettersWaitForTheNextOne(t *testing.T) {
	f := startFake(t, nil)
	old := &pb.DeadLetter{WorkerId: "w-1", Topic: "orders", Reason: "timeout", Attempts: 3, EventId: "o-1", Source: "shop", At: fixedTime}
	fresh := &pb.DeadLetter{WorkerId: "w-1", Topic: "orders", Reason: "worker_failed", Attempts: 3, EventId: "o-2", Source: "shop",
		At: timestamppb.New(fixedTime.AsTime().Add(time.Minute)), Traceback: pyTraceback}
	f.deadLetters = []*pb.DeadLetter{old}
	lists := 0
	f.onList = func(f *fakeAPI) {
		lists++
		if lists == 3 { // the baseline, one poll with nothing new, then the new one
			f.deadLetters = []*pb.DeadLetter{old, fresh}
		}
	}
	out := f.runOK(t, "dead-letters", "w-1", "--wait", "-o", "json")
	var ds []map[string]any
	if err := json.Unmarshal([]byte(out), &ds); err != nil || len(ds) != 1 || ds[0]["eventId"] != "o-2" {
		t.Fatalf("--wait printed %s (%v), want only o-2", out, err)
	}
	f.mu.Lock()
	f.onList = nil
	f.mu.Unlock()
	r := run(t, map[string]string{"WMCTL_TOKEN": goodToken, "WMCTL_ADDR": f.addr}, "", "dead-letters", "w-1", "--wait", "--timeout", "600ms")
	if r.code != ExitUnavailable || !strings.Contains(r.err, "no new dead letter of w-1 within --timeout 600ms") {
		t.Fatalf("--wait without a new one: exit %d, stderr %q", r.code, r.err)
	}
	// `publish` then `dead-letters --wait`: a dead letter given up on a
	// moment before the command started (dead-lettered at once) is shown,
	// not waited past.
	f.mu.Lock()
	f.deadLetters = []*pb.DeadLetter{old, {WorkerId: "w-1", Topic: "orders", Reason: "output_invalid", Attempts: 1, EventId: "o-3",
		Source: "shop", At: timestamppb.New(time.Now().Add(-2 * time.Second))}}
	f.mu.Unlock()
	out = f.runOK(t, "dead-letters", "w-1", "--wait", "--timeout", "5s", "-o", "json")
	if err := json.Unmarshal([]byte(out), &ds); err != nil || len(ds) != 1 || ds[0]["eventId"] != "o-3" {
		t.Fatalf("--wait right after a dead letter printed %s (%v), want only o-3", out, err)
	}
}

// Issue 44 item 3: get shows the worker's message counts and its last
// error, or that no node has reported yet.
func TestGetShowsCountsAndTheLastError(t *testing.T) {
	f := startFake(t, nil)
	f.add(&pb.Worker{WorkerId: "w-1", Name: "pricer", Topic: "orders", Status: pb.WorkerStatus_WORKER_STATUS_RUNNING, CodeVersion: 1})
	if out := f.runOK(t, "get", "pricer"); !strings.Contains(out, "no node has reported any yet") {
		t.Errorf("get before any report:\n%s", out)
	}
	f.mu.Lock()
	f.workers[0].Stats = &pb.WorkerStats{Processed: 5, Failed: 3, DeadLettered: 1, LastError: "worker failed: KeyError: 'price'",
		LastErrorAt: fixedTime, LastErrorEventId: "o-2"}
	f.workers[0].StatusReason = "quarantined: crashed the node 2 times (last event boom); reload or start it to try again"
	f.mu.Unlock()
	out := f.runOK(t, "get", "pricer")
	if !regexp.MustCompile(`Status: +RUNNING\nStatus reason: +quarantined: crashed the node 2 times`).MatchString(out) {
		t.Errorf("get does not show the status reason under the status:\n%s", out)
	}
	for _, w := range []string{"Processed:", "5", "Failed attempts:", "Dead-lettered:", "Last error:", "worker failed: KeyError: 'price'",
		"Last error at:", "2025-01-02T03:04:05Z (event o-2)"} {
		if !strings.Contains(out, w) {
			t.Errorf("get lacks %q:\n%s", w, out)
		}
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(f.runOK(t, "get", "pricer", "-o", "json")), &got); err != nil {
		t.Fatal(err)
	}
	if st, _ := got["stats"].(map[string]any); st["failed"] != "3" || st["lastErrorEventId"] != "o-2" {
		t.Errorf("-o json stats: %v", got["stats"])
	}
}

// events --follow names the worker next to its id and says where an error
// happened (the traceback's innermost frame).
func TestEventLineShowsNameAndWhere(t *testing.T) {
	line := eventLine(lifecycleEvent{Type: "com.virtufin.workmanager.lifecycle.error", Time: "t", data: lifecycleevents.Data{WorkerID: "w-1",
		WorkerName: "pricer", Topic: "orders", ErrorType: "worker_failed", ErrorMessage: "worker failed: KeyError: 'price'", Traceback: pyTraceback}})
	if !strings.Contains(line, `name=pricer topic=orders error_type=worker_failed where="<worker>:7 in price" error=`) {
		t.Errorf("line %q", line)
	}
}
