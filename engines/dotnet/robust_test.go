package dotnet

import (
	"bufio"
	"context"
	"errors"
	"os"
	goruntime "runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
)

const robustWorker = `
using System;
using System.Diagnostics;
using System.Threading.Tasks;
using Virtufin.Worker;
using Virtufin.Worker.Json;

public class Robust : IWorker
{
    public Task<CloudEvent> ProcessAsync(CloudEvent input)
    {
        if (input.Type == "gateway")
            HostServices.Gateway("billing", "charge", new byte[0]);
        if (input.Type == "big")
            return Task.FromResult(new CloudEvent { Type = "big", DataContentType = "application/json", Data = (JsonNode)new string('x', 4 << 20) });
        var data = new JsonObject { ["pid"] = Process.GetCurrentProcess().Id };
        return Task.FromResult(new CloudEvent { Type = "pid", DataContentType = "application/json", Data = data });
    }
}
`

// gatewayBlock holds every call until its ctx ends (or 5 minutes: far
// past the tests' bounds, which guard against a hang on a starved machine
// and are no speed tests); entered receives one value as each call
// arrives.
type gatewayBlock struct{ entered, ended chan error }

func (g *gatewayBlock) Call(ctx context.Context, _, _ string, _ []byte) ([]byte, error) {
	g.entered <- nil
	select {
	case <-ctx.Done():
		g.ended <- ctx.Err()
		return nil, ctx.Err()
	case <-time.After(5 * time.Minute):
		g.ended <- nil
		return []byte("{}"), nil
	}
}

func robustInstance(t *testing.T, cfg Config, timeout time.Duration) engines.Instance {
	t.Helper()
	e := newTestEngine(t, cfg)
	return enginetest.Load(t, e, engines.Spec{WorkerID: "w-robust", MIMEType: MIMESource, Timeout: timeout}, []byte(robustWorker))
}

func robustCall(inst engines.Instance, typ string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := inst.Process(ctx, enginetest.NewEvent("id-"+typ, typ, nil, ""))
	return err
}

// TestGatewayCallEndsAtTheDeadline is issue 34's item 3 for .NET: a
// gateway call in flight ends with the call's timeout and with Close.
func TestGatewayCallEndsAtTheDeadline(t *testing.T) {
	gw := &gatewayBlock{entered: make(chan error, 4), ended: make(chan error, 4)}
	inst := robustInstance(t, Config{Gateway: gw}, time.Second)
	start := time.Now()
	err := robustCall(inst, "gateway")
	if took := time.Since(start); took > time.Minute {
		t.Fatalf("the call took %v against a 1s timeout", took)
	}
	if !errors.Is(err, engines.ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	if gerr := recvWithin(t, gw.ended, "the gateway call's end"); gerr == nil {
		t.Fatal("the gateway call was not cancelled")
	}
	recvWithin(t, gw.entered, "the first gateway call")

	// Close cancels a gateway call in flight too. The call is in flight
	// once the gateway saw it: a host started on demand can take longer
	// than any fixed sleep on a loaded machine (a 500 ms sleep let Close
	// run before the call reached the gateway, and the test waited for
	// an end that never came).
	inst2 := robustInstance(t, Config{Gateway: gw}, 30*time.Second)
	go robustCall(inst2, "gateway")
	recvWithin(t, gw.entered, "the second gateway call")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start = time.Now()
	_ = inst2.Close(ctx)
	if took := time.Since(start); took > time.Minute {
		t.Fatalf("Close took %v with a 200ms context", took)
	}
	if gerr := recvWithin(t, gw.ended, "the gateway call's end after Close"); gerr == nil {
		t.Fatal("Close did not cancel the gateway call")
	}
}

// recvWithin receives one value from ch or fails the test after two
// minutes, naming what it waited for.
func recvWithin(t *testing.T, ch <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(2 * time.Minute):
		t.Fatalf("waited two minutes for %s", what)
		return nil
	}
}

// TestReplyOverLimitFailsWhileRead is issue 32's item 4 for .NET: the
// reader refuses a reply over the limit on its header, without
// allocating the announced length.
func TestReplyOverLimitFailsWhileRead(t *testing.T) {
	// 4 MiB against a 256 KiB limit: the worker's cost of building the
	// reply stays small on a busy machine (16 MiB took Mono over 30 s
	// there), and a reply read in full would still show in TotalAlloc.
	inst := robustInstance(t, Config{MaxReplyBytes: 256 << 10}, 2*time.Minute)
	var before, after goruntime.MemStats
	goruntime.GC()
	goruntime.ReadMemStats(&before)
	err := robustCall(inst, "big")
	goruntime.ReadMemStats(&after)
	if !errors.Is(err, engines.ErrReplyTooLarge) || !strings.Contains(err.Error(), "exceeds the limit of 262144 bytes") {
		t.Fatalf("err = %v, want ErrReplyTooLarge", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 2<<20 {
		t.Errorf("a refused 4 MiB reply cost the node %d bytes", grew)
	}
	if err := robustCall(inst, "pid"); err != nil {
		t.Fatalf("the next call: %v", err)
	}
}

// TestReadFrameDoesNotTrustTheHeader: a header announcing a big frame
// whose bytes never come costs next to nothing.
func TestReadFrameDoesNotTrustTheHeader(t *testing.T) {
	// Covered without a host: the reader over a pipe that closes early.
	p := &proc{maxReply: 512 << 20}
	r, w := pipeOf(t)
	p.rd = r
	go func() {
		w.Write([]byte{0, 0, 0, 30, 'R', '{'}) // 480 MiB announced, 1 byte sent
		w.Close()
	}()
	var before, after goruntime.MemStats
	goruntime.ReadMemStats(&before)
	_, _, err := p.readFrame()
	goruntime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("a truncated frame was read")
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Fatalf("a 480 MiB header with 1 byte behind it cost %d bytes", grew)
	}
}

func pipeOf(t *testing.T) (*bufio.Reader, *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return bufio.NewReader(r), w
}

// TestDeadIdleHostIsReplaced is issue 34's item 5 for .NET: a host that
// died while idle is replaced before the next call, which succeeds.
func TestDeadIdleHostIsReplaced(t *testing.T) {
	inst := robustInstance(t, Config{}, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := inst.Process(ctx, enginetest.NewEvent("id-pid", "pid", nil, ""))
	if err != nil {
		t.Fatal(err)
	}
	pid := int(enginetest.DataOf(t, out)["pid"].(float64))
	if n := len(inst.(*Instance).pool.Tracked()); n != 1 {
		t.Fatalf("the pool holds %d hosts, want 1", n)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Wait until the engine has seen the exit (the host's Done closed),
	// not for a time: 100 ms after the reap was not enough under a CPU
	// hog (CI-like run 17), and the call then went to the dead host.
	enginetest.WaitFor(t, "the engine to see the killed host's exit", inst.(*Instance).pool.AllExited)
	if err := robustCall(inst, "pid"); err != nil {
		t.Fatalf("the call after the host died idle: %v", err)
	}
}

// DOTNET_PARK_AFTER (#48 item 4): a worker idle for ParkAfter has its host
// retired (the pool tracks none); its next event starts one and is
// answered.
func TestIdleDotnetWorkerIsParked(t *testing.T) {
	inst := robustInstance(t, Config{ParkAfter: 300 * time.Millisecond}, 30*time.Second)
	if err := robustCall(inst, "pid"); err != nil {
		t.Fatal(err)
	}
	pool := inst.(*Instance).pool
	enginetest.WaitFor(t, "the idle worker's host to be parked", func() bool { return len(pool.Tracked()) == 0 && pool.Live() == 0 })
	if err := robustCall(inst, "pid"); err != nil {
		t.Fatalf("the call after parking: %v", err)
	}
	if n := len(pool.Tracked()); n != 1 {
		t.Fatalf("the pool holds %d hosts after the call, want 1", n)
	}
}

// A Load with Spec.Parked (a node attaching its workers again) starts no
// host when the engine parks idle workers: the first event starts one.
func TestParkedDotnetLoadStartsNoHost(t *testing.T) {
	e := newTestEngine(t, Config{ParkAfter: time.Hour})
	inst := enginetest.Load(t, e, engines.Spec{WorkerID: "w-parked", MIMEType: MIMESource, Timeout: 30 * time.Second, Parked: true}, []byte(robustWorker))
	pool := inst.(*Instance).pool
	if n := len(pool.Tracked()); n != 0 || pool.Live() != 0 {
		t.Fatalf("a parked Load started %d hosts (%d live), want none", n, pool.Live())
	}
	if err := robustCall(inst, "pid"); err != nil {
		t.Fatalf("the first event: %v", err)
	}
	if n := len(pool.Tracked()); n != 1 {
		t.Fatalf("the pool holds %d hosts after the first event, want 1", n)
	}
}
