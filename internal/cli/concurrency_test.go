package cli

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// create sends --max-concurrency and --max-processes when given and
// neither otherwise (the cluster's defaults); get shows them.
func TestCreateSendsConcurrency(t *testing.T) {
	f := startFake(t, nil)
	py := write(t, t.TempDir()+"/worker.py", "async def process(e): pass\n")
	f.runOK(t, "create", py, "--topic", "a", "--max-concurrency", "64", "--max-processes", "2")
	f.runOK(t, "create", py, "--topic", "b")
	f.mu.Lock()
	creates := f.creates
	f.mu.Unlock()
	if len(creates) != 2 {
		t.Fatalf("%d creates sent, want 2", len(creates))
	}
	if c := creates[0]; c.MaxConcurrency == nil || c.GetMaxConcurrency() != 64 || c.MaxProcesses == nil || c.GetMaxProcesses() != 2 {
		t.Errorf("create --max-concurrency 64 --max-processes 2 sent %v", c)
	}
	if c := creates[1]; c.MaxConcurrency != nil || c.MaxProcesses != nil {
		t.Errorf("create without them sent %v", c)
	}
	f.add(&pb.Worker{WorkerId: "wc-1", Topic: "a", MaxConcurrency: proto.Int32(64), MaxProcesses: proto.Int32(2)})
	f.add(&pb.Worker{WorkerId: "wc-2", Topic: "b"})
	d1, d2 := squeeze(f.runOK(t, "get", "wc-1")), squeeze(f.runOK(t, "get", "wc-2"))
	for _, c := range []struct{ detail, want string }{
		{d1, "Max concurrency: 64"}, {d1, "Max processes: 2"},
		{d2, "Max concurrency: cluster default"}, {d2, "Max processes: cluster default"},
	} {
		if !strings.Contains(c.detail, c.want) {
			t.Errorf("get lacks %q:\n%s", c.want, c.detail)
		}
	}
}
