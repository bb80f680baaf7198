package integration

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// TestNativeErrorAnswerIsAnsweredOnce is issue 49's item 2 on the real
// stack: a native worker answering error_message with return code 0 (the
// ABI's error answer) gets one worker.error event and one error response,
// with no retry and no dead letter; one returning a failure code is still
// retried and dead-lettered.
func TestNativeErrorAnswerIsAnsweredOnce(t *testing.T) {
	e := sharedEnv(t)
	in := topicName(t, "in")
	refuseType, failType := in+".refuse", in+".fail"
	dead := collectFrom(e.subscribe(in + dispatch.DeadLetterSuffix))
	answers := collectFrom(e.subscribe(refuseType + dispatch.ErrorSuffix))
	id := e.createWith(t, &pb.CreateWorkerRequest{Code: &pb.CodeSource{Source: &pb.CodeSource_Content{Content: nativePackage(t, "v1")}},
		MimeType: "application/x-native-dll", Topic: in, RetryPolicy: &pb.RetryPolicy{MaxAttempts: 2, BackoffMs: 100}})

	e.publishEvent(in, map[string]any{"id": "refuse-1", "type": refuseType, "correlationid": "corr-r",
		"datacontenttype": "application/json", "data": map[string]any{"sku": "a"}})
	e.publishEvent(in, map[string]any{"id": "fail-1", "type": failType, "datacontenttype": "application/json", "data": map[string]any{}})

	answerID := firstOutputID("refuse-1", id)
	waitFor(t, 60*time.Second, "the error response to refuse-1", func() bool { return len(answers.get(answerID)) > 0 })
	waitFor(t, 90*time.Second, "the dead letter of fail-1", func() bool { return len(dead.get("fail-1")) > 0 })

	ans := answers.get(answerID)[0]
	var data map[string]string
	if err := json.Unmarshal(ans.Data(), &data); err != nil || data["error"] != "no stock" || data["input_id"] != "refuse-1" || data["input_type"] != refuseType {
		t.Fatalf("error response data %s (%v)", ans.Data(), err)
	}
	if ans.Extensions()["correlationid"] != "corr-r" {
		t.Fatalf("error response extensions %v: want the input's correlationid", ans.Extensions())
	}
	if x := dead.get("fail-1")[0].Extensions(); x["deadletterreason"] != "worker_failed" {
		t.Fatalf("fail-1 dead letter %v: want worker_failed", x)
	}
	// Every attempt has been announced by now (the dead letter follows
	// them); the answer's event comes with its response.
	errorsFor := func(eventID string) (n int, types []string) {
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, l := range e.lifecycle {
			if l.Data.WorkerID == id && l.Type == lifecycleevents.TypePrefix+string(lifecycleevents.Error) && l.Data.EventID == eventID {
				n++
				types = append(types, l.Data.ErrorType)
			}
		}
		return n, types
	}
	waitFor(t, 30*time.Second, "worker.error for refuse-1", func() bool { n, _ := errorsFor("refuse-1"); return n > 0 })
	waitFor(t, 30*time.Second, "worker.error for both attempts at fail-1", func() bool { n, _ := errorsFor("fail-1"); return n >= 2 })
	if n, types := errorsFor("refuse-1"); n != 1 || types[0] != dispatch.ErrorTypeAnswer {
		t.Fatalf("refuse-1: %d worker.error events %v, want one %q", n, types, dispatch.ErrorTypeAnswer)
	}
	if n, types := errorsFor("fail-1"); n != 2 || types[0] != "worker_failed" {
		t.Fatalf("fail-1: %d worker.error events %v, want 2 worker_failed (max_attempts 2)", n, types)
	}
	// The answer was settled as done on its one delivery: a failed attempt
	// would have been announced then (worker_failed), beside the answer.
	if n := len(answers.get(answerID)); n != 1 {
		t.Fatalf("%d error responses to refuse-1, want 1", n)
	}
	if len(dead.get("refuse-1")) != 0 {
		t.Fatal("refuse-1 was dead-lettered")
	}
}
