//go:build linux || darwin || freebsd

package native

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/internal/procpool"
	"github.com/virtufin/workmanager/engines/native/internal/hostproto"
)

// fakeHost is a hostProc whose "host" is a goroutine on the other ends of
// its pipes: it answers each Process frame with an empty result after
// *delay, and behaves as a killed host does (it closes its pipes: the
// engine reads EOF) once Kill was called, also when the kill came between
// two calls. No process is started, so thousands of calls ending at their
// deadline take well under a second.
func fakeHost(t testing.TB, delay *atomic.Int64) *hostProc {
	t.Helper()
	reqR, reqW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	respR, respW, err := os.Pipe() // closed by Retire and the host; unused
	if err != nil {
		t.Fatal(err)
	}
	// The replies travel on an io.Pipe: the reply wakes the caller at once
	// (no poller in between), as a reply that comes in just before its
	// deadline's function runs would.
	pr, pw := io.Pipe()
	p := &hostProc{reqW: reqW, respR: respR, r: hostproto.NewReader(pr), w: hostproto.NewWriter(reqW),
		enc: newEncoder(), done: make(chan struct{}), tail: &tailLog{}}
	go func() {
		defer close(p.done)
		defer reqR.Close()
		defer respW.Close()
		defer pw.Close()
		r, w := hostproto.NewReader(reqR), hostproto.NewWriter(pw)
		for {
			if _, _, err := r.ReadFrame(); err != nil || p.killed.Load() {
				return
			}
			if d := time.Duration(delay.Load()); d > 0 {
				time.Sleep(d)
			}
			if p.killed.Load() {
				return
			}
			if err := w.WriteFrame(hostproto.FrameResult, hostproto.Int32(0), []byte{0}, hostproto.Int32(0)); err != nil {
				return
			}
		}
	}()
	return p
}

// TestLateDeadlineSparesTheNextCall is issue 34's item 2 for the isolated
// native host, as a stress test (like childproc's TestDisarmIsFinal):
// calls through hostInstance.run and exchange whose reply comes in right
// at their deadline. A call that returned healthy gave its host back to
// the pool; its deadline (timer or ctx) firing late must not kill that
// host under the next, innocent call, which would fail as a spurious
// timeout. The call guard (callGuard) makes "the call is over" and "the
// deadline killed the host" exclusive.
func TestLateDeadlineSparesTheNextCall(t *testing.T) {
	var delay atomic.Int64
	in := &hostInstance{e: newTestEngine(t, Config{}), spec: testSpec, wlog: slog.New(slog.DiscardHandler)}
	in.pool = procpool.New(procpool.Config[*hostProc]{
		Size: 1,
		Start: func(context.Context) (*hostProc, error) {
			p := fakeHost(t, &delay)
			p.r.Limit = in.e.hostFrameLimit
			if !in.pool.Track(p) {
				p.Kill()
				p.Retire()
				return nil, ErrClosed
			}
			return p, nil
		},
		Grace:  time.Second,
		Logger: slog.New(slog.DiscardHandler),
		Name:   "fake native host",
	})
	if err := procpool.FirstError(in.pool.Fill(context.Background()), nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := in.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})

	// With one P, the caller woken by the reply and the deadline's timer
	// run close together: the call often ends while the deadline's
	// function has started but not yet acted (what a busy node sees now
	// and then).
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	iterations := 300
	if testing.Short() {
		iterations = 100
	}
	ev := typed("test.echo", nil)
	healthy, timedOut, spurious := 0, 0, 0
	for i := range iterations {
		wait := time.Duration(50+rand.IntN(100)) * time.Microsecond
		in.timeout = wait
		delay.Store(int64(wait + time.Duration(i%4)*5*time.Microsecond))
		ctx := context.Background()
		var cancel context.CancelFunc = func() {}
		if i%2 == 1 { // half the calls also have a ctx deadline at the same time
			ctx, cancel = context.WithTimeout(ctx, wait)
		}
		s, err := in.pool.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		_, err = in.run(ctx, s, ev)
		cancel()
		switch {
		case err == nil:
			healthy++
		case errors.Is(err, engines.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
			timedOut++
		default:
			t.Fatalf("call %d: %v", i, err)
		}

		// Give a deadline function that already started every chance to
		// run to its end, then make an innocent call with time to spare.
		runtime.Gosched()
		time.Sleep(10 * time.Microsecond)
		in.timeout = 5 * time.Second
		delay.Store(0)
		s, err = in.pool.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := in.run(context.Background(), s, ev); err != nil {
			if !errors.Is(err, engines.ErrTimeout) {
				t.Fatalf("the call after call %d: %v", i, err)
			}
			spurious++
		}
	}
	if spurious > 0 {
		t.Fatalf("%d of %d innocent calls failed with a spurious timeout: the deadline of the call before them killed their host late (%d calls ended healthy, %d timed out)",
			spurious, iterations, healthy, timedOut)
	}
	t.Logf("%d iterations: %d ended healthy, %d timed out", iterations, healthy, timedOut)
}
