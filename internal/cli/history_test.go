package cli

import (
	"encoding/json"
	"strings"
	"testing"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Issue 43 item 6: GetWorkerHistory answers in pages; wmctl history shows
// every page, in every output format.
func TestHistoryShowsEveryPage(t *testing.T) {
	f := startFake(t, nil)
	f.pageSize = 1
	f.add(&pb.Worker{WorkerId: "w-1", Topic: "orders", Status: pb.WorkerStatus_WORKER_STATUS_RUNNING, CodeVersion: 2, MimeType: MIMEPython,
		UpdatedAt: fixedTime, CreatedAt: fixedTime})
	var hs []map[string]any
	if err := json.Unmarshal([]byte(f.runOK(t, "history", "w-1", "-o", "json")), &hs); err != nil || len(hs) != 2 || hs[0]["version"] != "1" || hs[1]["version"] != "2" {
		t.Fatalf("history -o json over pages of 1: %v %v", hs, err)
	}
	ht := f.runOK(t, "history", "w-1")
	if !strings.Contains(ht, "create") || !strings.Contains(ht, "rollback") {
		t.Fatalf("history table over pages of 1:\n%s", ht)
	}
}
