package dotnet

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
)

const manyOutputsWorker = `
using System.Collections.Generic;
using System.Threading.Tasks;
using Virtufin.Worker;

public class Many : IMultiOutputWorker
{
    public Task<IList<CloudEvent>> ProcessAllAsync(CloudEvent input)
    {
        var outs = new List<CloudEvent>();
        if (input.Type == "many")
            for (int i = 0; i < 50000; i++) outs.Add(new CloudEvent { Type = "a" });
        else
            for (int i = 0; i < 20; i++) outs.Add(new CloudEvent { Type = "a", DataBase64 = new byte[64 << 10] });
        return Task.FromResult<IList<CloudEvent>>(outs);
    }
}
`

// TestReplyDecodingIsBounded is issue 42's item 4 for .NET: a reply
// under the frame limit whose outputs would take many times the limit
// once decoded (50,000 tiny outputs) is refused before they are decoded,
// and no reply, refused or accepted, makes the node's heap grow by more
// than 3x the reply limit (docs/security.md).
func TestReplyDecodingIsBounded(t *testing.T) {
	limit := engines.ReplyLimit(20, 64<<10) // about 2 MiB
	e := newTestEngine(t, Config{MaxReplyBytes: limit})
	inst := enginetest.Load(t, e, engines.Spec{WorkerID: "w-many", MIMEType: MIMESource, Timeout: 2 * time.Minute}, []byte(manyOutputsWorker))
	run := func(typ string) ([]event.Event, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		return inst.Process(ctx, enginetest.NewEvent("id-"+typ, typ, nil, ""))
	}
	var out []event.Event
	var err error
	alloc, peak := enginetest.HeapDuring(func() { out, err = run("many") })
	t.Logf("50,000 tiny outputs: allocated %.2fx, peak %.2fx the limit of %d", float64(alloc)/float64(limit), float64(peak)/float64(limit), limit)
	if !errors.Is(err, engines.ErrReplyTooLarge) || !errors.Is(err, engines.ErrWorkerFailed) || len(out) != 0 {
		t.Errorf("%d outputs, err = %v; want ErrReplyTooLarge", len(out), err)
	} else if !strings.Contains(err.Error(), "would take more than the limit") {
		t.Errorf("err = %v", err)
	}
	if alloc > engines.ReplyMemoryMultiple*int64(limit) {
		t.Errorf("the refused reply cost the node %d bytes, %.1fx the limit", alloc, float64(alloc)/float64(limit))
	}

	alloc, peak = enginetest.HeapDuring(func() { out, err = run("full") })
	t.Logf("20 outputs of 64 KiB: allocated %.2fx, peak %.2fx the limit", float64(alloc)/float64(limit), float64(peak)/float64(limit))
	if err != nil || len(out) != 20 || len(out[19].Data()) != 64<<10 {
		t.Fatalf("a reply at the limit: %d outputs, %v", len(out), err)
	}
	if alloc > engines.ReplyMemoryMultiple*int64(limit) {
		t.Errorf("a reply at the limit cost the node %d bytes, %.1fx the limit", alloc, float64(alloc)/float64(limit))
	}
}
