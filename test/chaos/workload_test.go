package chaos

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/devstack"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// state of a worker as the API answered it. uncertain covers a lifecycle
// call in flight or one that failed: the worker may be either way.
type state int

const (
	absent state = iota
	running
	stopped
	uncertain
	deleted
)

func (s state) String() string {
	return [...]string{"absent", "running", "stopped", "uncertain", "deleted"}[s]
}

// segment: the worker was in st from `from` until the next segment.
type segment struct {
	from time.Time
	st   state
}

// wrec is what the journal knows of one worker.
type wrec struct {
	id, name, topic, out, group, kind string
	poison                            bool
	version                           int
	segs                              []segment
}

func (w *wrec) set(at time.Time, st state) { w.segs = append(w.segs, segment{at, st}) }

func (w *wrec) current() state {
	if len(w.segs) == 0 {
		return absent
	}
	return w.segs[len(w.segs)-1].st
}

// at returns the state at t and when that state ends (zero: still).
func (w *wrec) at(t time.Time) (state, time.Time, time.Time) {
	st, from, until := absent, time.Time{}, time.Time{}
	for i, s := range w.segs {
		if s.from.After(t) {
			until = s.from
			break
		}
		st, from = s.st, s.from
		_ = i
	}
	return st, from, until
}

// fault is one injected fault.
type fault struct {
	Kind, Target string
	Start, End   time.Time
	Err          string
	Note         string // what the fault saw (issue 43's kinds)
}

// pendingSnap is the set of a topic's input entries pending (unacked) in
// the broker at a time.
type pendingSnap struct {
	at  time.Time
	ids map[string]bool // stream entry ids
}

// replay is one dead letter the API answered as replayed: event to worker,
// asked at at, answered at answered.
type replay struct {
	worker, event string
	at, answered  time.Time
}

// journal is the harness's own record: what it asked of the API and what
// was answered, and the faults injected. The checker reads it with what
// Redis holds.
type journal struct {
	mu        sync.Mutex
	t0        time.Time
	workers   map[string]*wrec
	faults    []fault
	apiErrors map[string]int
	slow      []slowCallRec
	// answered holds every lifecycle call the API answered OK: each must
	// have its lifecycle event (lifecycleAnnounced).
	answered []answeredCall
	replays  []replay
	// pendingAt holds, per worker, the input entries of its topic the
	// broker held unacked just before each StopWorker/DeleteWorker call:
	// what the stop could drop from the worker's backlog.
	pendingAt map[string][]pendingSnap
	published atomic.Int64
	pubFailed atomic.Int64
	logf      func(string, ...any)
}

// slowCall is how long a lifecycle call may take, retries included,
// before the journal keeps it (finding 10 of docs/reliability.md: a
// CreateWorker that answered after minutes).
const slowCall = time.Minute

// answeredCall is a lifecycle call the API answered OK.
type answeredCall struct {
	what, name, id string
	at             time.Time
}

// answer journals a lifecycle call the API answered OK.
func (j *journal) answer(what string, w *wrec) {
	j.mu.Lock()
	j.answered = append(j.answered, answeredCall{what: what, name: w.name, id: w.id, at: time.Now()})
	j.mu.Unlock()
}

// slowCallRec is one lifecycle call that took longer than slowCall.
type slowCallRec struct {
	what, name string
	at         time.Time
	took       time.Duration
	err        error
}

func newJournal(logf func(string, ...any)) *journal {
	return &journal{t0: time.Now(), workers: map[string]*wrec{}, apiErrors: map[string]int{}, pendingAt: map[string][]pendingSnap{}, logf: logf}
}

func (j *journal) rel(t time.Time) string { return fmt.Sprintf("t+%.1fs", t.Sub(j.t0).Seconds()) }

func (j *journal) worker(id string) *wrec {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.workers[id]
}

// pythonWorker is the soak's Python worker: its output carries its name,
// code version, entry and exit times (ns, this machine's wall clock), the
// fencing token it saw and its node. With poison, inputs whose data has
// "poison" raise. Grouped workers sleep a little so that overlapping
// executions would show.
//
// The poison worker is also the slow one: on inputs whose data has "slow"
// it sleeps past WORKER_TIMEOUT (the node kills the call).
func pythonWorker(name, out, version string, poison bool, sleepMS int) []byte {
	fail := ""
	if poison {
		fail = fmt.Sprintf(`    if data.get("poison"):
        raise ValueError("poisoned input " + event["id"])
    if data.get("slow"):
        time.sleep(%g)
`, (workerTimeout + 3*time.Second).Seconds())
	}
	return []byte(fmt.Sprintf(`
import os, time

def process(event):
    enter = time.time_ns()
    data = event.get("data") or {}
    if not isinstance(data, dict):
        data = {}
%s    if %d:
        time.sleep(%d / 1000.0)
    return {"type": %q, "data": {"w": %q, "v": %q, "enter": enter, "exit": time.time_ns(),
            "tok": event.get("fencingtoken"), "node": os.environ.get("WORKMANAGER_NODE_ID")}}
`, fail, sleepMS, sleepMS, out, name, version))
}

// nativePackage builds testdata/chaos_native.c into a native worker zip.
func nativePackage(t *testing.T, out, version string) []byte {
	t.Helper()
	dir := t.TempDir()
	so := filepath.Join(dir, "libnativeworker.so")
	cmd := exec.Command("gcc", "-O2", "-shared", "-fPIC", "-I", filepath.Join(repoRoot(), "sdk", "native"),
		fmt.Sprintf(`-DVERSION="%s"`, version), fmt.Sprintf(`-DOUT_TOPIC="%s"`, out), "-o", so, filepath.Join("testdata", "chaos_native.c"))
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, b)
	}
	lib, err := os.ReadFile(so)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for name, body := range map[string][]byte{
		"manifest.json": []byte(`{"abi_version": 1, "library": "nativeworker"}`),
		"runtimes/linux-x64/native/libnativeworker.so": lib,
	} {
		w, err := zw.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = w.Write(body)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func content(code []byte) *pb.CodeSource {
	return &pb.CodeSource{Source: &pb.CodeSource_Content{Content: code}}
}

// workload drives publishers and lifecycle churn.
type workload struct {
	t      *testing.T
	c      *cluster
	j      *journal
	topics []string
	native map[string][]byte // topic → native package
	rng    *rand.Rand
	rate   float64 // events per second per topic
	poison float64 // fraction of poison events
	slow   float64 // fraction of slow events (the poison worker sleeps past its timeout)
	// groupSleep is how long a grouped worker's call sleeps (ms).
	groupSleep int
	seq        atomic.Int64
}

// call runs one lifecycle call of the worker named name with retries for
// up to limit; the worker w (nil: not yet known, or the call does not make
// it uncertain) is uncertain from the first attempt until an answer. A
// call that took longer than slowCall in all is journaled: its worker's
// workflow history is kept with the stack's logs.
func (wl *workload) call(ctx context.Context, what, name string, w *wrec, limit time.Duration, fn func(context.Context) error) (err error) {
	began := time.Now()
	defer func() {
		if took := time.Since(began); took > slowCall {
			wl.j.mu.Lock()
			wl.j.slow = append(wl.j.slow, slowCallRec{what: what, name: name, at: began, took: took, err: err})
			wl.j.mu.Unlock()
		}
	}()
	deadline := time.Now().Add(limit)
	if w != nil {
		wl.j.mu.Lock()
		w.set(time.Now(), uncertain)
		wl.j.mu.Unlock()
	}
	for {
		cctx, cancel := context.WithTimeout(ctx, 45*time.Second)
		err = fn(cctx)
		cancel()
		if err == nil {
			return nil
		}
		switch status.Code(err) {
		case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied, codes.Unauthenticated:
			wl.j.logf("%s %s: %s refused: %v", wl.j.rel(time.Now()), what, idOf(w), err)
			return err // a refusal: retrying does not help
		}
		wl.j.mu.Lock()
		wl.j.apiErrors[what]++
		wl.j.mu.Unlock()
		wl.j.logf("%s %s: %s failed: %v", wl.j.rel(time.Now()), what, idOf(w), err)
		if time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		sleepCtx(ctx, 2*time.Second)
	}
}

func idOf(w *wrec) string {
	if w == nil {
		return ""
	}
	return w.name + "(" + w.id + ")"
}

// create makes a worker and records it running from the answer.
func (wl *workload) create(ctx context.Context, name, topic, group, kind string, poison bool) (*wrec, error) {
	out := topic + "-out"
	w := &wrec{name: name, topic: topic, out: out, group: group, kind: kind, poison: poison, version: 1}
	req := &pb.CreateWorkerRequest{Topic: topic, Group: group, RequestId: "chaos-" + name, Name: name}
	if kind == "native" {
		req.Code, req.MimeType = content(wl.native[topic]), "application/x-native-dll"
	} else {
		req.Code, req.MimeType = content(wl.code(w)), "text/x-python"
	}
	var id string
	began := time.Now()
	err := wl.call(ctx, "CreateWorker", name, nil, 3*time.Minute, func(cctx context.Context) error {
		r, err := wl.c.client.CreateWorker(cctx, req)
		if err == nil {
			id = r.GetWorkerId()
		}
		return err
	})
	if err != nil {
		// A create whose every call failed may still have happened (the
		// API answers "it may still complete"): learn its outcome by name,
		// or the journal would miss a worker that runs (and is never
		// deleted).
		var st pb.WorkerStatus
		if id, st = wl.lookup(name); id == "" {
			return nil, err
		}
		wl.j.logf("%s CreateWorker %s: gave up, but the worker exists (%s, %v)", wl.j.rel(time.Now()), name, id, st)
		w.id = id
		wl.j.mu.Lock()
		w.set(began, uncertain)
		if st == pb.WorkerStatus_WORKER_STATUS_RUNNING {
			w.set(time.Now(), running)
		}
		wl.j.workers[id] = w
		wl.j.mu.Unlock()
		return w, nil
	}
	w.id = id
	wl.j.answer("CreateWorker", w)
	wl.j.mu.Lock()
	w.set(time.Now(), running)
	wl.j.workers[id] = w
	wl.j.mu.Unlock()
	return w, nil
}

// lookup asks the API for the worker named name, retrying for up to two
// minutes while the API fails: its id and status, or "" when it does not
// exist.
func (wl *workload) lookup(name string) (string, pb.WorkerStatus) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		r, err := wl.c.client.GetWorker(ctx, &pb.GetWorkerRequest{WorkerId: name})
		cancel()
		switch {
		case err == nil:
			return r.GetWorkerId(), r.GetStatus()
		case status.Code(err) == codes.NotFound || time.Now().After(deadline):
			return "", 0
		}
		time.Sleep(2 * time.Second)
	}
}

func (wl *workload) code(w *wrec) []byte {
	sleep := 0
	if w.group != "" {
		sleep = wl.groupSleep
	}
	return pythonWorker(w.name, w.out, fmt.Sprintf("v%d", w.version), w.poison, sleep)
}

// snapshotPending records the entries of w's topic the broker holds
// unacked, just before a stop or delete of w.
func (wl *workload) snapshotPending(w *wrec) {
	pel, err := pendingEntries(wl.c.stack.RedisAddr, w.topic)
	if err != nil {
		wl.j.logf("%s pending entries of %s before stopping %s: %v", wl.j.rel(time.Now()), w.topic, idOf(w), err)
		return
	}
	ids := make(map[string]bool, len(pel))
	for id := range pel {
		ids[id] = true
	}
	wl.j.mu.Lock()
	wl.j.pendingAt[w.id] = append(wl.j.pendingAt[w.id], pendingSnap{at: time.Now(), ids: ids})
	wl.j.mu.Unlock()
}

func (wl *workload) stop(ctx context.Context, w *wrec) error {
	wl.snapshotPending(w)
	err := wl.call(ctx, "StopWorker", w.name, w, 3*time.Minute, func(cctx context.Context) error {
		_, err := wl.c.client.StopWorker(cctx, &pb.StopWorkerRequest{WorkerId: w.id})
		return err
	})
	if err == nil {
		wl.j.answer("StopWorker", w)
		wl.mark(w, stopped)
	}
	return err
}

func (wl *workload) start(ctx context.Context, w *wrec) error {
	err := wl.call(ctx, "StartWorker", w.name, w, 3*time.Minute, func(cctx context.Context) error {
		_, err := wl.c.client.StartWorker(cctx, &pb.StartWorkerRequest{WorkerId: w.id})
		return err
	})
	if err == nil {
		wl.j.answer("StartWorker", w)
		wl.mark(w, running)
	}
	return err
}

func (wl *workload) remove(ctx context.Context, w *wrec) error {
	wl.snapshotPending(w)
	err := wl.call(ctx, "DeleteWorker", w.name, w, 3*time.Minute, func(cctx context.Context) error {
		_, err := wl.c.client.DeleteWorker(cctx, &pb.DeleteWorkerRequest{WorkerId: w.id})
		return err
	})
	if err == nil {
		wl.j.answer("DeleteWorker", w)
		wl.mark(w, deleted)
	}
	if status.Code(err) == codes.NotFound {
		// An attempt whose answer was lost (the call's deadline passed
		// while a node was paused) deleted it, and the retry found it
		// gone: deleted, from now on (the API answered no OK, so no
		// lifecycle event is required of it).
		wl.j.logf("%s DeleteWorker %s: NOT_FOUND on a retry: counted deleted from now", wl.j.rel(time.Now()), idOf(w))
		wl.mark(w, deleted)
	}
	return err
}

// load replaces a Python worker's code by its next version (same
// behaviour). The worker stays running: a reload is no gap.
func (wl *workload) load(ctx context.Context, w *wrec) error {
	wl.j.mu.Lock()
	w.version++
	code := wl.code(w)
	wl.j.mu.Unlock()
	err := wl.call(ctx, "LoadCode", w.name, nil, 3*time.Minute, func(cctx context.Context) error {
		_, err := wl.c.client.LoadCode(cctx, &pb.LoadCodeRequest{WorkerId: w.id, Code: content(code)})
		return err
	})
	if err == nil {
		wl.j.answer("LoadCode", w)
	}
	return err
}

// rollback loads an earlier version's code again (RollbackWorker), as the
// next version. The worker stays running.
func (wl *workload) rollback(ctx context.Context, w *wrec, to int) error {
	err := wl.call(ctx, "RollbackWorker", w.name, nil, 3*time.Minute, func(cctx context.Context) error {
		_, err := wl.c.client.RollbackWorker(cctx, &pb.RollbackWorkerRequest{WorkerId: w.id, Version: int64(to)})
		return err
	})
	if err == nil {
		wl.j.answer("RollbackWorker", w)
		wl.j.mu.Lock()
		w.version++
		wl.j.mu.Unlock()
	}
	return err
}

// replayDead replays up to 20 of w's stored dead letters
// (ReplayDeadLetters) and records which, and when, in the journal.
func (wl *workload) replayDead(ctx context.Context, w *wrec) (int, error) {
	var ids []string
	start := time.Now()
	err := wl.call(ctx, "ReplayDeadLetters", w.name, nil, 3*time.Minute, func(cctx context.Context) error {
		r, err := wl.c.client.ReplayDeadLetters(cctx, &pb.ReplayDeadLettersRequest{WorkerId: w.id, Limit: 20})
		if err == nil {
			ids = append(ids, r.GetEventIds()...)
		}
		return err
	})
	// Ids of an attempt that failed after replaying some are lost to the
	// journal: the checker only checks the replays it knows of.
	wl.j.mu.Lock()
	for _, id := range ids {
		wl.j.replays = append(wl.j.replays, replay{worker: w.id, event: id, at: start, answered: time.Now()})
	}
	wl.j.mu.Unlock()
	return len(ids), err
}

func (wl *workload) mark(w *wrec, st state) {
	wl.j.mu.Lock()
	w.set(time.Now(), st)
	wl.j.mu.Unlock()
}

// setup creates the long-lived workers: per topic an ungrouped Python
// worker that fails on poison inputs, a native worker and a group of two
// Python workers.
func (wl *workload) setup(ctx context.Context) error {
	for i, topic := range wl.topics {
		g := fmt.Sprintf("g%d", i+1)
		specs := []struct {
			name, group, kind string
			poison            bool
		}{
			{fmt.Sprintf("py%d", i+1), "", "python", true},
			{fmt.Sprintf("nat%d", i+1), "", "native", false},
			{fmt.Sprintf("%sa", g), topic + "-" + g, "python", false},
			{fmt.Sprintf("%sb", g), topic + "-" + g, "python", false},
		}
		for _, s := range specs {
			if s.kind == "native" && wl.native[topic] == nil {
				continue
			}
			w, err := wl.create(ctx, s.name, topic, s.group, s.kind, s.poison)
			if err != nil {
				return fmt.Errorf("create %s: %w", s.name, err)
			}
			wl.j.logf("created %s %s on %s (group %q)", s.kind, idOf(w), topic, s.group)
		}
	}
	return nil
}

// publishLoop publishes to topic at wl.rate with a burst now and then,
// until ctx ends.
func (wl *workload) publishLoop(ctx context.Context, topic, prefix string, rng *rand.Rand) {
	interval := time.Duration(float64(time.Second) / wl.rate)
	nextBurst := time.Now().Add(time.Duration(15+rng.Intn(20)) * time.Second)
	for ctx.Err() == nil {
		n := 1
		if time.Now().After(nextBurst) {
			n = 20 + rng.Intn(30)
			nextBurst = time.Now().Add(time.Duration(20+rng.Intn(30)) * time.Second)
		}
		for range n {
			id := fmt.Sprintf("%s-%06d", prefix, wl.seq.Add(1))
			data := map[string]any{"n": id}
			switch x := rng.Float64(); {
			case x < wl.poison:
				data["poison"] = true
			case x < wl.poison+wl.slow:
				data["slow"] = true
			}
			wl.publish(ctx, topic, id, data)
		}
		sleepCtx(ctx, interval)
	}
}

// publish sends a structured CloudEvent through the stack's own daprd
// (not a node's), retrying for up to 30 s while the broker is away. The
// checker takes what Redis holds as the truth of what was published.
func (wl *workload) publish(ctx context.Context, topic, id string, data map[string]any) {
	body, _ := json.Marshal(map[string]any{"specversion": "1.0", "id": id, "source": "chaos", "type": "chaos.input",
		"datacontenttype": "application/json", "data": data})
	url := fmt.Sprintf("http://%s/v1.0/publish/%s/%s", wl.c.stack.DaprHTTPAddr, devstack.PubSubName, topic)
	cl := http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/cloudevents+json")
		resp, err := cl.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				wl.j.published.Add(1)
				return
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			wl.j.pubFailed.Add(1)
			return
		}
		sleepCtx(ctx, 250*time.Millisecond)
	}
}

// churnLoop runs lifecycle operations through the API until ctx ends: a
// stop and later start of a long-lived worker, a LoadCode, or a
// short-lived worker created and deleted.
func (wl *workload) churnLoop(ctx context.Context, rng *rand.Rand) {
	tmp := 0
	for ctx.Err() == nil {
		sleepCtx(ctx, time.Duration(6+rng.Intn(10))*time.Second)
		if ctx.Err() != nil {
			return
		}
		wl.j.mu.Lock()
		var long []*wrec
		for _, w := range wl.j.workers {
			if !strings.HasPrefix(w.name, "tmp") && w.current() == running {
				long = append(long, w)
			}
		}
		wl.j.mu.Unlock()
		sort.Slice(long, func(a, b int) bool { return long[a].name < long[b].name })
		switch k := rng.Intn(5); {
		case k == 0 && len(long) > 0:
			w := long[rng.Intn(len(long))]
			// Each operation runs to its answer even when the run ends
			// meanwhile (a fresh context): the journal must know its outcome.
			if err := wl.stop(opCtx(), w); err != nil {
				continue
			}
			wl.j.logf("%s churn: stopped %s", wl.j.rel(time.Now()), idOf(w))
			sleepCtx(ctx, time.Duration(3+rng.Intn(10))*time.Second)
			// Always started again, even at the end (a fresh context).
			sctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			err := wl.start(sctx, w)
			cancel()
			wl.j.logf("%s churn: started %s: %v", wl.j.rel(time.Now()), idOf(w), err)
		case k == 1 && len(long) > 0:
			var py []*wrec
			for _, w := range long {
				if w.kind == "python" {
					py = append(py, w)
				}
			}
			if len(py) == 0 {
				continue
			}
			w := py[rng.Intn(len(py))]
			err := wl.load(opCtx(), w)
			wl.j.logf("%s churn: LoadCode %s v%d: %v", wl.j.rel(time.Now()), idOf(w), w.version, err)
		case k == 2 && len(long) > 0:
			var py []*wrec
			for _, w := range long {
				if w.kind == "python" && w.version > 1 {
					py = append(py, w)
				}
			}
			if len(py) == 0 {
				continue
			}
			w := py[rng.Intn(len(py))]
			to := 1 + rng.Intn(w.version-1)
			err := wl.rollback(opCtx(), w, to)
			wl.j.logf("%s churn: RollbackWorker %s to v%d (now v%d): %v", wl.j.rel(time.Now()), idOf(w), to, w.version, err)
		case k == 3 && len(long) > 0:
			// Mostly the poison worker's dead letters (poison and slow
			// inputs), now and then another's (fault reasons).
			var cands []*wrec
			for _, w := range long {
				if w.poison || rng.Intn(4) == 0 {
					cands = append(cands, w)
				}
			}
			if len(cands) == 0 {
				continue
			}
			w := cands[rng.Intn(len(cands))]
			n, err := wl.replayDead(opCtx(), w)
			wl.j.logf("%s churn: ReplayDeadLetters %s: %d replayed: %v", wl.j.rel(time.Now()), idOf(w), n, err)
		default:
			tmp++
			topic := wl.topics[rng.Intn(len(wl.topics))]
			w, err := wl.create(opCtx(), fmt.Sprintf("tmp%d", tmp), topic, "", "python", false)
			if err != nil {
				continue
			}
			wl.j.logf("%s churn: created %s on %s", wl.j.rel(time.Now()), idOf(w), topic)
			sleepCtx(ctx, time.Duration(10+rng.Intn(20))*time.Second)
			dctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			err = wl.remove(dctx, w)
			cancel()
			wl.j.logf("%s churn: deleted %s: %v", wl.j.rel(time.Now()), idOf(w), err)
		}
	}
}

// opCtx bounds one lifecycle operation with its retries; it is not tied
// to the run's end.
func opCtx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	time.AfterFunc(4*time.Minute, cancel)
	return ctx
}
