package chaos

import (
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/lifecycleevents"
)

// The checker must be able to fail: on a made-up history with one
// violation of each kind it reports each, and on the same history without
// them it passes. Runs in plain go test (no stack).
func TestCheckerCatchesViolations(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	ns := func(s float64) int64 { return at(s).UnixNano() }
	build := func(broken bool) (*journal, *observed) {
		j := newJournal(t.Logf)
		j.t0 = t0
		add := func(id, name, group string, poison bool, segs ...segment) {
			j.workers[id] = &wrec{id: id, name: name, topic: "t", out: "t-out", group: group, poison: poison, segs: segs}
		}
		add("P", "py", "", true, segment{at(0), running})
		add("A", "ga", "g", false, segment{at(0), running})
		add("B", "gb", "g", false, segment{at(0), running})
		add("S", "stopper", "", false, segment{at(0), running}, segment{at(100), stopped})
		o := &observed{inputs: map[string][]input{}, byInput: map[string]map[string]*input{}, outputs: map[string][]output{}, deads: map[string][]dead{}}
		o.inputs["t"] = []input{{id: "m1", at: at(1), copies: 1}, {id: "m2", at: at(2), copies: 1}, {id: "bad", at: at(3), poison: true, copies: 1},
			{id: "slow", at: at(3.5), slow: true, copies: 1}}
		o.byInput["t"] = map[string]*input{}
		for i := range o.inputs["t"] {
			o.byInput["t"][o.inputs["t"][i].id] = &o.inputs["t"][i]
		}
		out := func(in, w string, s float64, tok string, enter, exit float64) output {
			return output{id: in + "/" + w + "/0", in: in, worker: w, at: at(s), tok: tok, enter: ns(enter), exit: ns(exit)}
		}
		o.outputs["t"] = []output{
			out("m1", "P", 1.1, "", 0, 0), out("m1", "A", 1.2, "1", 1.10, 1.15), out("m1", "B", 1.3, "2", 1.16, 1.2), out("m1", "S", 1.4, "", 0, 0),
			out("m2", "A", 2.2, "3", 2.10, 2.15), out("m2", "S", 2.4, "", 0, 0),
			out("bad", "A", 3.2, "5", 3.10, 3.15), out("bad", "B", 3.3, "6", 3.16, 3.2), out("bad", "S", 3.4, "", 0, 0),
			out("slow", "A", 3.6, "7", 3.55, 3.58), out("slow", "B", 3.7, "8", 3.6, 3.65), out("slow", "S", 3.8, "", 0, 0),
		}
		o.deads["t"] = []dead{{id: "bad", worker: "P", reason: "worker_failed", at: at(4)}}
		// The poison dead letter is replayed at t+50 s.
		j.replays = []replay{{worker: "P", event: "bad", at: at(50), answered: at(50.5)}}
		if broken {
			// m2 never answered by P nor B; B's m2 ran inside A's with an
			// older token; a dead letter of a healthy input; an output of
			// the stopped worker long after its stop.
			o.outputs["t"] = append(o.outputs["t"], out("m2", "B", 2.3, "2", 2.12, 2.14), out("m2", "S", 200, "", 0, 0))
			o.deads["t"] = append(o.deads["t"], dead{id: "m1", worker: "S", reason: "internal", at: at(5)})
			o.outputs["t"] = removeOutput(o.outputs["t"], "m2/P/0")
			// The slow input is not dead-lettered (timeout) for P; the
			// replayed poison input is not run again.
		} else {
			o.outputs["t"] = append(o.outputs["t"], out("m2", "P", 2.1, "", 0, 0), out("m2", "B", 2.3, "4", 2.16, 2.2))
			o.deads["t"] = append(o.deads["t"], dead{id: "slow", worker: "P", reason: "timeout", at: at(40)},
				dead{id: "bad", worker: "P", reason: "worker_failed", at: at(80)})
		}
		sort.SliceStable(o.deads["t"], func(a, b int) bool { return o.deads["t"][a].at.Before(o.deads["t"][b].at) })
		// A stream is in time order.
		sort.SliceStable(o.outputs["t"], func(a, b int) bool { return o.outputs["t"][a].at.Before(o.outputs["t"][b].at) })
		return j, o
	}

	j, o := build(false)
	if v := check(j, o, []string{"t"}); !v.ok() {
		for _, iv := range v.invariants {
			t.Errorf("clean history: %s: %v", iv.name, iv.failures)
		}
	}

	j, o = build(true)
	v := check(j, o, []string{"t"})
	want := map[string]string{
		"no loss":                "m2 on t (published t+2.0s) never answered by py(P)",
		"dead letters only":      `dead letter of m1 on t for worker stopper(S) at t+5.0s: reason "internal"`,
		"no overlap":             "group g: m2/B/0",
		"fencing":                "group g: token 2 on output m2/B/0",
		"no outputs by stopped":  "output m2/S/0 by stopper(S) at t+200.0s: stopped since t+100.0s",
		"poison and slow events": "slow event slow (published t+3.5s) not dead-lettered for py(P)",
		"replayed dead letters":  "dead letter bad of py(P) replayed at t+50.0s (answered t+50.5s) not run again",
	}
	for _, iv := range v.invariants {
		for prefix, example := range want {
			if !strings.HasPrefix(iv.name, prefix) {
				continue
			}
			switch {
			case example == "" && len(iv.failures) > 0:
				t.Errorf("%s: unexpected failures %v", iv.name, iv.failures)
			case example != "" && (len(iv.failures) == 0 || !strings.Contains(strings.Join(iv.failures, "\n"), example)):
				t.Errorf("%s: want a counter-example containing %q, got %v", iv.name, example, iv.failures)
			}
		}
	}
}

func removeOutput(outs []output, id string) []output {
	var kept []output
	for _, o := range outs {
		if o.id != id {
			kept = append(kept, o)
		}
	}
	return kept
}

// The leak bound: a node whose goroutines, live heap or RSS grew past the
// tolerance fails, one within it passes, and unknown figures fail.
func TestLeakBound(t *testing.T) {
	n := func(id string, rss, heap, gors int64) nodeFig {
		return nodeFig{id: id, rssKB: rss, heapKB: heap, gors: gors, childGors: -1}
	}
	before := figures{n("n1", 50000, 10000, 200), n("n2", 50000, 10000, 200), n("n3", 50000, 10000, 200), n("n4", 50000, 10000, 200), n("n5", 50000, 10000, 200)}
	// n5's resident memory past the bound is free heap the Go runtime
	// keeps for reuse: not counted.
	kept := n("n5", 130000, 10000, 200)
	kept.keptKB = 40000
	ok := figures{n("n1", 60000, 12000, 210), n("n2", 99000, 15000, 225), n("n3", 40000, 8000, 150), n("n4", 82000, 14000, 200), kept}
	if iv := leaks(before, ok); len(iv.failures) != 0 || iv.checked != 5 {
		t.Fatalf("within the tolerance: %v (%d checked)", iv.failures, iv.checked)
	}
	bad := figures{n("n1", 60000, 10000, 226), n("n2", 101000, 10000, 200), n("n3", 50000, -1, 200), n("n4", 60000, 15100, 200)}
	iv := leaks(before, bad)
	got := strings.Join(iv.failures, "\n")
	for _, want := range []string{"n1: 226 goroutines after the run, 200 before", "n2: anonymous RSS 101000 kB after the run, 50000 kB before",
		"n3: figures unknown", "n4: live Go heap 15100 kB after the run, 10000 kB before"} {
		if !strings.Contains(got, want) {
			t.Errorf("want %q in %q", want, got)
		}
	}
	// The goroutines that wait on child processes (a worker's extra
	// processes not retired yet) are not the node's own.
	withChildren := func(gors, children int64) figures {
		f := n("n1", 50000, 10000, gors)
		f.children = children
		return figures{f}
	}
	if iv := leaks(withChildren(200, 2), withChildren(240, 10)); len(iv.failures) != 0 {
		t.Fatalf("8 more child processes: %v", iv.failures)
	}
	if iv := leaks(withChildren(200, 2), withChildren(240, 2)); len(iv.failures) != 1 ||
		!strings.Contains(iv.failures[0], "n1: 240 goroutines after the run, 200 before (6 and 6 of them waiting on child processes)") {
		t.Fatalf("40 more goroutines, the same child processes: %v", iv.failures)
	}
	// Counted in the goroutine dump when it was read: a fork server's
	// workers are its children, not the node's, and their goroutines
	// (42 for 14 of them) are not the node's own either.
	withWaiters := func(gors, children, waiters int64) figures {
		f := n("n1", 50000, 10000, gors)
		f.children, f.childGors = children, waiters
		return figures{f}
	}
	if iv := leaks(withWaiters(280, 4, 12), withWaiters(298, 1, 42)); len(iv.failures) != 0 {
		t.Fatalf("14 forked workers: %v", iv.failures)
	}
	if iv := leaks(withWaiters(280, 4, 12), withWaiters(320, 4, 12)); len(iv.failures) != 1 {
		t.Fatalf("40 more goroutines, the same waiters: %v", iv.failures)
	}
}

// childWaiters counts the goroutines of a dump whose stacks wait on a
// child process, and only those.
func TestChildWaiters(t *testing.T) {
	dump := `goroutine profile: total 50
28 @ 0x490f2e 0x46cea5
#	0x1	internal/poll.runtime_pollWait+0x84	/x.go:1
#	0x2	github.com/virtufin/workmanager/engines/internal/childproc.(*Proc).waitExternal.func1+0x1	/y.go:2

14 @ 0x490f2e
#	0x3	github.com/virtufin/workmanager/engines/python.(*forked).next+0x1	/z.go:3
#	0x4	github.com/virtufin/workmanager/engines/internal/childproc.(*Proc).wait+0x1	/z.go:4

3 @ 0x490f2e
#	0x5	os/exec.(*Cmd).writerDescriptor.func1+0x1	/e.go:5

5 @ 0x490f2e
#	0x6	github.com/virtufin/workmanager/internal/dispatch.(*Dispatcher).serve+0x104	/d.go:6
`
	if got := childWaiters([]byte(dump)); got != 45 {
		t.Fatalf("childWaiters = %d, want 45", got)
	}
}

// Under placement a node's share moves: a node that serves more workers
// after the run than before is compared with a node that served as many
// before (finding: seed 4546, n2 served one topic before, two after).
func TestLeakBoundFollowsTheShare(t *testing.T) {
	n := func(id string, gors int64, workers int) nodeFig {
		return nodeFig{id: id, rssKB: 50000, heapKB: 10000, gors: gors, workers: workers}
	}
	before := figures{n("n1", 207, 8), n("n2", 142, 4), n("n3", 146, 4)}
	moved := figures{n("n1", 144, 4), n("n2", 207, 8), n("n3", 141, 4)}
	if iv := leaks(before, moved); len(iv.failures) != 0 || iv.checked != 3 {
		t.Fatalf("shares swapped, no leak: %v (%d checked)", iv.failures, iv.checked)
	}
	leaked := figures{n("n1", 144, 4), n("n2", 240, 8), n("n3", 141, 4)}
	iv := leaks(before, leaked)
	if len(iv.failures) != 1 || !strings.Contains(iv.failures[0], "n2: 240 goroutines after the run, 207 before (compared with n1's figures") {
		t.Fatalf("a leak on a node whose share moved: %v", iv.failures)
	}
	// No node had the new share before: its own figures, the counts said.
	alone := figures{n("n1", 144, 4), n("n2", 300, 12), n("n3", 141, 4)}
	iv = leaks(before, alone)
	if len(iv.failures) != 1 || !strings.Contains(iv.failures[0], "12 workers attached after, 4 before; no node had 12 before") {
		t.Fatalf("a share no node had before: %v", iv.failures)
	}
}

// A worker stopped with an input still in its backlog — the input still
// worked on (answered by another worker) within settle of the stop, though
// the stopped worker had answered a later input meanwhile (a group's retries
// and per-node queues reorder it) — is a backlog at stop (a WARN), not a
// loss; an input whose last answer came long before the stop is a loss.
func TestBacklogAtStopIsNotALoss(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	j := newJournal(t.Logf)
	j.t0 = t0
	j.workers["G"] = &wrec{id: "G", name: "ga", topic: "t", out: "t-out", segs: []segment{{at(0), running}, {at(100), stopped}}}
	j.workers["O"] = &wrec{id: "O", name: "other", topic: "t", out: "t-out", segs: []segment{{at(0), running}}}
	o := &observed{inputs: map[string][]input{}, byInput: map[string]map[string]*input{}, outputs: map[string][]output{}, deads: map[string][]dead{},
		pel: map[string]map[string]string{}}
	o.inputs["t"] = []input{{id: "lost", sid: "1-0", at: at(5), copies: 1}, {id: "queued", sid: "2-0", at: at(6), copies: 1}, {id: "later", sid: "3-0", at: at(7), copies: 1}}
	o.byInput["t"] = map[string]*input{}
	for i := range o.inputs["t"] {
		o.byInput["t"][o.inputs["t"][i].id] = &o.inputs["t"][i]
	}
	out := func(in, w string, s float64) output {
		return output{id: in + "/" + w + "/0", in: in, worker: w, at: at(s)}
	}
	// G answered "later" (published after both) before its stop; "lost"
	// was last answered at t+5.1 (long before the stop), "queued" at t+80.
	o.outputs["t"] = []output{out("lost", "O", 5.1), out("later", "O", 7.1), out("later", "G", 8), out("queued", "O", 80)}
	v := check(j, o, []string{"t"})
	for _, iv := range v.invariants {
		got := strings.Join(iv.failures, "\n")
		switch {
		case strings.HasPrefix(iv.name, "no loss"):
			if len(iv.failures) != 1 || !strings.Contains(got, "lost on t (published t+5.0s) never answered by ga(G)") || !strings.Contains(got, "entry 1-0 not pending (acked)") {
				t.Errorf("no loss: %v", iv.failures)
			}
		case strings.HasPrefix(iv.name, "backlog"):
			if len(iv.failures) != 1 || !strings.Contains(got, "queued on t (published t+6.0s) pending for ga(G)") {
				t.Errorf("backlog: %v", iv.failures)
			}
		}
	}
}

// With a snapshot of the broker's pending entries taken just before the
// stop, the checker uses it instead of the heuristics: an input the
// stopped worker never answered is backlog exactly when its entry was
// pending then (also a poison input not yet dead-lettered), and a loss
// otherwise, however late the other workers answered it.
func TestBacklogAtStopFromThePendingSnapshot(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	j := newJournal(t.Logf)
	j.t0 = t0
	j.workers["G"] = &wrec{id: "G", name: "ga", topic: "t", out: "t-out", poison: true, segs: []segment{{at(0), running}, {at(100), uncertain}, {at(101), stopped}}}
	j.workers["O"] = &wrec{id: "O", name: "other", topic: "t", out: "t-out", segs: []segment{{at(0), running}}}
	j.pendingAt["G"] = []pendingSnap{{at: at(99.9), ids: map[string]bool{"2-0": true, "3-0": true}}}
	o := &observed{inputs: map[string][]input{}, byInput: map[string]map[string]*input{}, outputs: map[string][]output{}, deads: map[string][]dead{},
		pel: map[string]map[string]string{}}
	o.inputs["t"] = []input{{id: "lost", sid: "1-0", at: at(5), copies: 1}, {id: "queued", sid: "2-0", at: at(6), copies: 1},
		{id: "bad", sid: "3-0", at: at(7), poison: true, copies: 1}}
	o.byInput["t"] = map[string]*input{}
	for i := range o.inputs["t"] {
		o.byInput["t"][o.inputs["t"][i].id] = &o.inputs["t"][i]
	}
	out := func(in, w string, s float64) output {
		return output{id: in + "/" + w + "/0", in: in, worker: w, at: at(s)}
	}
	// "lost" is answered by O late (t+90, within settle of the stop: the
	// heuristics would call it backlog), but the broker no longer held it
	// before the stop; "queued" was answered by O early (t+6.1), but the
	// broker still held it.
	o.outputs["t"] = []output{out("queued", "O", 6.1), out("bad", "O", 7.1), out("lost", "O", 90)}
	v := check(j, o, []string{"t"})
	for _, iv := range v.invariants {
		got := strings.Join(iv.failures, "\n")
		switch {
		case strings.HasPrefix(iv.name, "no loss"):
			if len(iv.failures) != 1 || !strings.Contains(got, "lost on t (published t+5.0s) never answered by ga(G)") {
				t.Errorf("no loss: %v", iv.failures)
			}
		case strings.HasPrefix(iv.name, "poison"):
			if len(iv.failures) != 0 {
				t.Errorf("poison: %v", iv.failures)
			}
		case strings.HasPrefix(iv.name, "backlog"):
			if len(iv.failures) != 2 || !strings.Contains(got, "queued on t (published t+6.0s) pending for ga(G)") ||
				!strings.Contains(got, "poison event bad on t (published t+7.0s) not yet dead-lettered for ga(G)") {
				t.Errorf("backlog: %v", iv.failures)
			}
		}
	}
}

// A replayed dead letter that reaches a node while its worker is being
// stopped is dead-lettered again as not_running: allowed; the same reason
// on a dead letter never replayed, or while the worker runs, fails.
func TestNotRunningDeadLetterOfAReplay(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	j := newJournal(t.Logf)
	j.t0 = t0
	j.workers["P"] = &wrec{id: "P", name: "py", topic: "t", out: "t-out", poison: true,
		segs: []segment{{at(0), running}, {at(100), uncertain}, {at(102), stopped}, {at(110), running}}}
	j.replays = []replay{{worker: "P", event: "bad", at: at(50), answered: at(50.5)}, {worker: "P", event: "bad2", at: at(50), answered: at(50.5)}}
	o := &observed{inputs: map[string][]input{}, byInput: map[string]map[string]*input{}, outputs: map[string][]output{}, deads: map[string][]dead{},
		pel: map[string]map[string]string{}}
	o.inputs["t"] = []input{{id: "bad", sid: "1-0", at: at(5), poison: true, copies: 2}, {id: "bad2", sid: "2-0", at: at(6), poison: true, copies: 2},
		{id: "bad3", sid: "3-0", at: at(7), poison: true, copies: 1}}
	o.byInput["t"] = map[string]*input{}
	for i := range o.inputs["t"] {
		o.byInput["t"][o.inputs["t"][i].id] = &o.inputs["t"][i]
	}
	o.deads["t"] = []dead{{id: "bad", worker: "P", reason: "worker_failed", at: at(40)}, {id: "bad2", worker: "P", reason: "worker_failed", at: at(41)},
		{id: "bad3", worker: "P", reason: "worker_failed", at: at(42)},
		{id: "bad", worker: "P", reason: "not_running", at: at(99)},   // replayed, stop answered 3 s later: allowed
		{id: "bad2", worker: "P", reason: "not_running", at: at(60)},  // replayed, but P ran: fails
		{id: "bad3", worker: "P", reason: "not_running", at: at(101)}} // never replayed: fails
	v := check(j, o, []string{"t"})
	for _, iv := range v.invariants {
		if !strings.HasPrefix(iv.name, "dead letters only") {
			continue
		}
		got := strings.Join(iv.failures, "\n")
		if len(iv.failures) != 2 || !strings.Contains(got, "dead letter of bad2") || !strings.Contains(got, "dead letter of bad3") {
			t.Errorf("dead letters: %v", iv.failures)
		}
	}
}

// The lifecycle check fails for an answered call without its event, and
// for fewer code_updated events than answered code changes.
func TestLifecycleAnnouncedCatchesAMissingEvent(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	j := newJournal(t.Logf)
	j.t0 = t0
	for _, c := range []string{"CreateWorker", "StopWorker", "StartWorker", "LoadCode", "RollbackWorker", "DeleteWorker"} {
		j.answered = append(j.answered, answeredCall{what: c, name: "py", id: "W", at: t0})
	}
	ev := func(kind, id string) entry {
		return entry{ce: map[string]any{"type": lifecycleevents.TypePrefix + kind, "data": map[string]any{"worker_id": id}}}
	}
	all := []entry{ev("created", "W"), ev("stopped", "W"), ev("started", "W"), ev("code_updated", "W"), ev("code_updated", "W"),
		ev("deleted", "W"), ev("dead_lettered", "W"), ev("created", "other")}
	if iv, line := lifecycleAnnounced(j, all); len(iv.failures) != 0 || iv.checked != 6 {
		t.Fatalf("complete history: failures %v, checked %d (%s)", iv.failures, iv.checked, line)
	}
	// No "stopped" for W, one code_updated for two code changes.
	broken := []entry{all[0], all[2], all[3], all[5], ev("stopped", "other")}
	iv, _ := lifecycleAnnounced(j, broken)
	if len(iv.failures) != 2 || !strings.Contains(iv.failures[0], `StopWorker of py(W)`) || !strings.Contains(iv.failures[1], "2 code changes answered, 1 code_updated") {
		t.Fatalf("broken history: failures %q, want the missing stopped event and the missing code_updated", iv.failures)
	}
}

// A worker the API no longer lists as running (deleted, say, while a node
// was paused) must not produce outputs once the cluster converged.
func TestServedAfterConvergenceCatchesAResurrection(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	j := newJournal(t.Logf)
	j.t0 = t0
	j.workers["R"] = &wrec{id: "R", name: "run", topic: "t", segs: []segment{{at(0), running}}}
	j.workers["D"] = &wrec{id: "D", name: "gone", topic: "t", segs: []segment{{at(0), running}, {at(10), deleted}}}
	o := &observed{outputs: map[string][]output{"t": {
		{id: "m1/R/0", worker: "R", at: at(100)},
		{id: "m0/D/0", worker: "D", at: at(50)},                           // before convergence: another rule's
		{id: "m1/D/0", worker: "D", at: at(60 + stopBound.Seconds() - 1)}, // within the bound
	}}}
	running := map[string]bool{"R": true}
	if iv := servedAfterConvergence(j, o, []string{"t"}, running, at(60)); len(iv.failures) != 0 || iv.checked != 1 {
		t.Fatalf("clean: %d checked, failures %v", iv.checked, iv.failures)
	}
	o.outputs["t"] = append(o.outputs["t"], output{id: "m2/D/0", worker: "D", node: "n2", at: at(90)}, output{id: "m2/X/0", worker: "X", at: at(91)})
	iv := servedAfterConvergence(j, o, []string{"t"}, running, at(60))
	if len(iv.failures) != 2 || !strings.Contains(iv.failures[0], "gone(D) (journal: deleted)") || !strings.Contains(iv.failures[1], "by X") {
		t.Fatalf("want the deleted worker's and the unknown worker's outputs, got %v", iv.failures)
	}
}

// The state-write outage's ACL: read-only on the state store's keys,
// read-write on every other key.
func TestStateWriteACL(t *testing.T) {
	got := strings.Join(stateWriteACL("ab/"), " ")
	want := `resetkeys ~[^a]* ~a[^b]* ~a ~ab[^/]* ~ab %R~ab/*`
	if got != want {
		t.Fatalf("stateWriteACL(ab/) = %q, want %q", got, want)
	}
}
