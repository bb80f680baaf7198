package dotnet

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
)

// An exception a C# worker throws reaches the node with its stack, through
// the engine-neutral engines.Traceback the hot path reads (issue 44 item 2).
func TestExceptionCarriesItsStack(t *testing.T) {
	e := newTestEngine(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	inst, err := e.Load(ctx, engines.Spec{WorkerID: "tb", MIMEType: MIMESource}, []byte(`
using System;
using System.Threading.Tasks;
using Virtufin.Worker;

public class Pricer : IWorker
{
        public Task<CloudEvent> ProcessAsync(CloudEvent input)
    {
        string sku = null;
        if (sku.Length > 0) throw new InvalidOperationException("unreachable");
        return Task.FromResult<CloudEvent>(null);
    }
}
`))
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(context.Background())
	_, err = inst.Process(ctx, enginetest.NewEvent("tb-1", "order", nil, ""))
	if !errors.Is(err, engines.ErrWorkerFailed) {
		t.Fatalf("err = %v, want ErrWorkerFailed", err)
	}
	tb := engines.Traceback(err)
	for _, w := range []string{"System.NullReferenceException: Object reference not set", "at Pricer.ProcessAsync"} {
		if !strings.Contains(tb, w) {
			t.Errorf("traceback lacks %q:\n%s", w, tb)
		}
	}
	if strings.Contains(tb, "Virtufin.WorkManager.Host") {
		t.Errorf("traceback shows the host's own frames:\n%s", tb)
	}
}
