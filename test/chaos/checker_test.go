package chaos

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/virtufin/workmanager/internal/lifecycleevents"
)

// Bounds of the checker, from the node settings (stack_test.go).
var (
	// settle: an event published while a worker runs must be answered by
	// it when the worker then stays running at least this long (delivery,
	// one redelivery after the broker's processing timeout, the call).
	settle = processingTimeout + workerTimeout + 10*time.Second
	// stopBound: a stopped or deleted worker may finish calls already
	// running for this long after the answer.
	stopBound = workerTimeout + 5*time.Second
	// poisonSettle: a poison input is dead-lettered after maxAttempts
	// deliveries, each failed attempt answered RETRY and redelivered by
	// Redis after its processing timeout.
	poisonSettle = time.Duration(maxAttempts)*(processingTimeout+time.Second) + workerTimeout + 10*time.Second
	// slowSettle: a slow input is dead-lettered (timeout) for the slow
	// worker after maxAttempts calls, each killed at twice WORKER_TIMEOUT
	// at most (a hang inside a batch: engines/python/batch.go), each then
	// redelivered after the processing timeout.
	slowSettle = time.Duration(maxAttempts)*(processingTimeout+2*workerTimeout+time.Second) + 10*time.Second
)

// Leak tolerance: after the run and its drain, each node may hold at most
// leakGoroutines more goroutines, leakHeap times the live Go heap (after two
// collections) and leakRSS times the anonymous resident memory (RssAnon)
// it had before the run (after its workers were loaded). The live heap is where a leak of the
// node's own shows; RSS also counts freed heap the Go runtime keeps (up to
// its heap goal, twice the live heap with GOGC=100: a node that worked
// through a backlog keeps more than one that has not) and native memory
// (the native workers run in-process), so its bound is a backstop.
const (
	leakGoroutines = 25
	leakHeap       = 1.5
	leakRSS        = 2.0
)

// faultReasons are dead-letter reasons a fault may force on a healthy
// event; any other reason on a healthy event is a violation.
var faultReasons = map[string]bool{"lock_contention": true, "lock_error": true, "stale_lock": true,
	"publish_failed": true, "timeout": true}

type input struct {
	id     string
	sid    string // stream entry id
	at     time.Time
	poison bool
	slow   bool
	copies int
}

type output struct {
	id, in, worker string
	at             time.Time
	tok            string
	enter, exit    int64
	node           string
}

type dead struct {
	id, worker, reason, err string
	at                      time.Time
}

// observed is what Redis holds after the run, per topic.
type observed struct {
	inputs  map[string][]input // topic → inputs in publish order
	byInput map[string]map[string]*input
	outputs map[string][]output // output topic → outputs in stream order
	deads   map[string][]dead   // topic → dead letters
	// pel describes the input entries still pending in the broker (not
	// acked), by topic and stream entry id (pendingEntries).
	pel map[string]map[string]string
}

// broker tells whether the broker still holds input in (pending, not
// acked) or not (acked, or never delivered).
func (o *observed) broker(topic string, in *input) string {
	if d, ok := o.pel[topic][in.sid]; ok {
		return "entry " + in.sid + " " + d
	}
	return "entry " + in.sid + " not pending (acked)"
}

func observe(redisAddr string, topics []string) (*observed, error) {
	o := &observed{inputs: map[string][]input{}, byInput: map[string]map[string]*input{}, outputs: map[string][]output{}, deads: map[string][]dead{},
		pel: map[string]map[string]string{}}
	for _, topic := range topics {
		pel, err := pendingEntries(redisAddr, topic)
		if err != nil {
			return nil, err
		}
		o.pel[topic] = pel
		ins, err := readStream(redisAddr, topic)
		if err != nil {
			return nil, err
		}
		o.byInput[topic] = map[string]*input{}
		idx := map[string]int{}
		for _, e := range ins {
			id := e.str("id")
			if i, ok := idx[id]; ok {
				o.inputs[topic][i].copies++
				continue
			}
			in := input{id: id, sid: e.sid, at: e.at, copies: 1}
			if d := e.data(); d != nil {
				in.poison = d["poison"] == true
				in.slow = d["slow"] == true
			}
			idx[id] = len(o.inputs[topic])
			o.inputs[topic] = append(o.inputs[topic], in)
		}
		outs, err := readStream(redisAddr, topic+"-out")
		if err != nil {
			return nil, err
		}
		for _, e := range outs {
			id := e.str("id")
			parts := strings.Split(id, "/")
			if len(parts) < 3 {
				continue
			}
			out := output{id: id, in: parts[0], worker: parts[1], at: e.at, tok: e.str("fencingtoken")}
			if d := e.data(); d != nil {
				out.enter, out.exit = num(d["enter"]), num(d["exit"])
				out.node, _ = d["node"].(string)
			}
			o.outputs[topic] = append(o.outputs[topic], out)
		}
		ds, err := readStream(redisAddr, topic+"-dead")
		if err != nil {
			return nil, err
		}
		for _, e := range ds {
			o.deads[topic] = append(o.deads[topic], dead{id: e.str("id"), worker: e.str("deadletterworker"),
				reason: e.str("deadletterreason"), err: e.str("deadlettererror"), at: e.at})
		}
	}
	// After the loop: the byInput pointers must point into the final slices.
	for topic, ins := range o.inputs {
		for i := range ins {
			o.byInput[topic][ins[i].id] = &o.inputs[topic][i]
		}
	}
	return o, nil
}

func num(v any) int64 {
	switch x := v.(type) {
	case json.Number:
		n, _ := x.Int64()
		return n
	case float64:
		return int64(x)
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

// invariant is one promise checked with its counter-examples.
type invariant struct {
	name     string
	failures []string
	checked  int
	warn     bool // reported, does not fail the run
}

func (iv *invariant) fail(format string, a ...any) {
	iv.failures = append(iv.failures, fmt.Sprintf(format, a...))
}

// verdict is the checker's result.
type verdict struct {
	invariants []*invariant
	lines      []string // figures
	pending    int      // required answers still missing
}

func (v *verdict) ok() bool {
	for _, iv := range v.invariants {
		if len(iv.failures) > 0 && !iv.warn {
			return false
		}
	}
	return true
}

func (v *verdict) addf(format string, a ...any) { v.lines = append(v.lines, fmt.Sprintf(format, a...)) }

// check proves the invariants over what Redis holds and what the journal
// recorded the API answering.
func check(j *journal, o *observed, topics []string) *verdict {
	j.mu.Lock()
	defer j.mu.Unlock()
	v := &verdict{}
	loss := &invariant{name: "no loss (answered or dead-lettered by every worker running when published)"}
	poisonIv := &invariant{name: "poison and slow events dead-letter (worker_failed, timeout) for the poison worker, answered by the others"}
	deadIv := &invariant{name: "dead letters only for poison events or with a fault reason"}
	overlap := &invariant{name: "no overlap of accepted executions in a group"}
	fencing := &invariant{name: "fencing tokens on a group's outputs never go backwards nor repeat"}
	stoppedIv := &invariant{name: "no outputs by stopped or deleted workers after the bound"}
	replayIv := &invariant{name: "replayed dead letters run again (an output or a new dead letter of the worker)"}
	backlog := &invariant{name: "backlog of a worker at its stop/delete (inputs it had not reached; reported, not failed)", warn: true}
	v.invariants = []*invariant{loss, poisonIv, deadIv, overlap, fencing, stoppedIv, replayIv, backlog}

	published, poisoned, slowed, inCopies := 0, 0, 0, 0
	answered := map[string]map[string]int{} // worker → input → output entries
	outIDs := map[string]int{}
	for _, topic := range topics {
		for _, in := range o.inputs[topic] {
			published++
			inCopies += in.copies - 1
			if in.poison {
				poisoned++
			}
			if in.slow {
				slowed++
			}
		}
		for _, out := range o.outputs[topic] {
			if answered[out.worker] == nil {
				answered[out.worker] = map[string]int{}
			}
			answered[out.worker][out.in]++
			outIDs[out.id]++
		}
	}
	deadOf := map[string][]dead{} // worker/input → dead letters
	deadByReason := map[string]int{}
	for _, topic := range topics {
		for _, d := range o.deads[topic] {
			deadOf[d.worker+"/"+d.id] = append(deadOf[d.worker+"/"+d.id], d)
			deadByReason[d.reason]++
		}
	}

	ids := make([]string, 0, len(j.workers))
	for id := range j.workers {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(a, b int) bool { return j.workers[ids[a]].name < j.workers[ids[b]].name })

	// No loss; poison; near-stop misses.
	nearStop, required, poisonMissing := 0, 0, 0
	for _, wid := range ids {
		w := j.workers[wid]
		for _, in := range o.inputs[w.topic] {
			st, _, until := w.at(in.at)
			if st != running {
				continue
			}
			bound := settle
			what, want := "", ""
			switch {
			case w.poison && in.poison:
				bound, what, want = poisonSettle, "poison", "worker_failed"
			case w.poison && in.slow:
				bound, what, want = slowSettle, "slow", "timeout"
			}
			mustAnswer := until.IsZero() || until.Sub(in.at) >= bound
			got := answered[wid][in.id] > 0
			dl := deadOf[wid+"/"+in.id]
			if what != "" {
				poisonIv.checked++
				if got {
					poisonIv.fail("%s event %s answered by poison worker %s (published %s)", what, in.id, idOf(w), j.rel(in.at))
				}
				if mustAnswer && len(dl) == 0 && !until.IsZero() && pendingAtStop(j, w, &in, until) == 1 {
					backlog.checked++
					backlog.fail("%s event %s on %s (published %s) not yet dead-lettered for %s and still pending in the broker when it was stopped/deleted at %s", what, in.id, w.topic, j.rel(in.at), idOf(w), j.rel(until))
					continue
				}
				if mustAnswer && len(dl) == 0 {
					required++
					poisonMissing++
					poisonIv.fail("%s event %s (published %s) not dead-lettered for %s; answered by: %s; dead letters of it: %v; %s", what, in.id, j.rel(in.at), idOf(w), whoAnswered(j, o, w.topic, in.id), deadsOf(o, w.topic, in.id), o.broker(w.topic, &in))
				}
				for _, d := range dl {
					if d.reason != want && !faultReasons[d.reason] && !replayedWhileNotRunning(j, w, d) {
						poisonIv.fail("%s event %s dead-lettered for %s with reason %q", what, in.id, idOf(w), d.reason)
					}
				}
				continue
			}
			if !mustAnswer {
				if !got && len(dl) == 0 {
					nearStop++
				}
				continue
			}
			if !until.IsZero() && !got && len(dl) == 0 && backlogAtStop(j, o, w, &in, until) {
				// Stopped or deleted with this input still in its backlog:
				// the other workers acked it meanwhile.
				backlog.checked++
				backlog.fail("%s on %s (published %s) pending for %s when it was stopped/deleted at %s; answered by: %s", in.id, w.topic, j.rel(in.at), idOf(w), j.rel(until), whoAnswered(j, o, w.topic, in.id))
				continue
			}
			required++
			loss.checked++
			if !got && len(dl) == 0 {
				loss.fail("%s on %s (published %s) never answered by %s (state %s until %s); answered by: %s; %s", in.id, w.topic, j.rel(in.at), idOf(w), st, relOrEnd(j, until), whoAnswered(j, o, w.topic, in.id), o.broker(w.topic, &in))
			}
		}
	}
	missing := len(loss.failures) + poisonMissing

	// Dead letters.
	for _, topic := range topics {
		for _, d := range o.deads[topic] {
			deadIv.checked++
			in := o.byInput[topic][d.id]
			w := j.workers[d.worker]
			switch {
			case in != nil && in.poison && w != nil && w.poison && d.reason == "worker_failed":
			case in != nil && in.slow && w != nil && w.poison && d.reason == "timeout":
			case w != nil && replayedWhileNotRunning(j, w, d):
			case faultReasons[d.reason]:
			default:
				deadIv.fail("dead letter of %s on %s for worker %s at %s: reason %q error %q", d.id, topic, idOf(w), j.rel(d.at), d.reason, d.err)
			}
		}
	}

	// Groups: overlap and fencing, over the outputs in stream order.
	groups := map[string][]output{}
	for _, topic := range topics {
		for _, out := range o.outputs[topic] {
			w := j.workers[out.worker]
			if w == nil || w.group == "" {
				continue
			}
			groups[w.group] = append(groups[w.group], out)
		}
	}
	gnames := make([]string, 0, len(groups))
	for g := range groups {
		gnames = append(gnames, g)
	}
	sort.Strings(gnames)
	for _, g := range gnames {
		outs := groups[g]
		var max int64 = -1
		seen := map[int64]string{} // token → execution key
		execs := map[string]output{}
		for _, out := range outs {
			fencing.checked++
			key := fmt.Sprintf("%s@%d", out.id, out.enter)
			tok, err := strconv.ParseInt(out.tok, 10, 64)
			if err != nil {
				fencing.fail("group %s: output %s at %s has no fencing token (%q)", g, out.id, j.rel(out.at), out.tok)
				continue
			}
			if prev, ok := seen[tok]; ok && prev != key {
				fencing.fail("group %s: token %d on output %s at %s was already on %s", g, tok, out.id, j.rel(out.at), prev)
			} else if !ok && tok < max {
				fencing.fail("group %s: token %d on output %s (node %s) at %s after token %d", g, tok, out.id, out.node, j.rel(out.at), max)
			}
			seen[tok] = key
			if tok > max {
				max = tok
			}
			execs[key] = out
		}
		list := make([]output, 0, len(execs))
		for _, e := range execs {
			list = append(list, e)
		}
		sort.Slice(list, func(a, b int) bool { return list[a].enter < list[b].enter })
		var last output
		for i, e := range list {
			overlap.checked++
			if i > 0 && e.enter < last.exit {
				overlap.fail("group %s: %s (worker %s, node %s, token %s, %s–%s) overlaps %s (worker %s, node %s, token %s, ends %s)", g,
					e.id, e.worker, e.node, e.tok, relNS(j, e.enter), relNS(j, e.exit), last.id, last.worker, last.node, last.tok, relNS(j, last.exit))
			}
			if i == 0 || e.exit > last.exit {
				last = e
			}
		}
	}

	// No work by stopped or deleted workers.
	for _, topic := range topics {
		for _, out := range o.outputs[topic] {
			w := j.workers[out.worker]
			if w == nil {
				continue
			}
			stoppedIv.checked++
			st, from, _ := w.at(out.at)
			if (st == stopped || st == deleted) && out.at.Sub(from) > stopBound {
				stoppedIv.fail("output %s by %s at %s: %s since %s", out.id, idOf(w), j.rel(out.at), st, j.rel(from))
			}
		}
	}

	// Replays: each replayed dead letter is run again by its worker (an
	// output or a new dead letter after the replay) when the worker stays
	// running long enough afterwards.
	for _, r := range j.replays {
		w := j.workers[r.worker]
		if w == nil {
			continue
		}
		in := o.byInput[w.topic][r.event]
		st, _, until := w.at(r.answered)
		bound := settle
		if in != nil && in.poison {
			bound = poisonSettle
		} else if in != nil && in.slow {
			bound = slowSettle
		}
		if st != running || (!until.IsZero() && until.Sub(r.answered) < bound) {
			continue
		}
		replayIv.checked++
		again := false
		for _, out := range o.outputs[w.topic] {
			if out.worker == w.id && out.in == r.event && out.at.After(r.at) {
				again = true
			}
		}
		for _, d := range deadOf[w.id+"/"+r.event] {
			if d.at.After(r.at) {
				again = true
			}
		}
		if !again {
			required++
			replayIv.fail("dead letter %s of %s replayed at %s (answered %s) not run again; dead letters of it: %v", r.event, idOf(w), j.rel(r.at), j.rel(r.answered), deadsOf(o, w.topic, r.event))
		}
	}
	missing += len(replayIv.failures)

	// Figures.
	outEntries, dupEntries, multi := 0, 0, 0
	for _, n := range outIDs {
		outEntries += n
		dupEntries += n - 1
	}
	for _, m := range answered {
		for _, n := range m {
			if n > 1 {
				multi++
			}
		}
	}
	v.pending = missing
	v.addf("events published (distinct ids in the input streams): %d, of which poison %d, slow %d; extra copies in the streams (replays) %d; publisher HTTP successes %d, given up %d",
		published, poisoned, slowed, inCopies, j.published.Load(), j.pubFailed.Load())
	v.addf("dead letters replayed (answered by ReplayDeadLetters): %d", len(j.replays))
	v.addf("answers required by the no-loss rule: %d; missed near a stop/delete (not required): %d", required, nearStop)
	v.addf("output entries: %d, distinct output ids: %d, duplicate entries: %d (inputs answered more than once by one worker: %d)",
		outEntries, len(outIDs), dupEntries, multi)
	var reasons []string
	for r, n := range deadByReason {
		reasons = append(reasons, fmt.Sprintf("%s=%d", r, n))
	}
	sort.Strings(reasons)
	v.addf("dead letters by reason: %s", strings.Join(reasons, " "))
	v.addf("latency publish→first output per (input, worker): %s", latency(j, o, topics))
	return v
}

func relOrEnd(j *journal, t time.Time) string {
	if t.IsZero() {
		return "the end"
	}
	return j.rel(t)
}

func relNS(j *journal, ns int64) string { return j.rel(time.Unix(0, ns)) }

// latency reports p50, p99 and max publish→output latency (Redis entry
// times), overall and for inputs published away from any fault.
func latency(j *journal, o *observed, topics []string) string {
	first := map[string]time.Time{}
	for _, topic := range topics {
		for _, out := range o.outputs[topic] {
			k := out.worker + "/" + out.in
			if t, ok := first[k]; !ok || out.at.Before(t) {
				first[k] = out.at
			}
		}
	}
	var all, calm []time.Duration
	var worstID string
	var worst time.Duration
	for _, topic := range topics {
		for _, in := range o.inputs[topic] {
			for wid, w := range j.workers {
				if w.topic != topic {
					continue
				}
				t, ok := first[wid+"/"+in.id]
				if !ok {
					continue
				}
				d := t.Sub(in.at)
				all = append(all, d)
				if d > worst {
					worst, worstID = d, fmt.Sprintf("%s by %s", in.id, w.name)
				}
				nearFault := false
				for _, f := range j.faults {
					if !in.at.Before(f.Start.Add(-5*time.Second)) && in.at.Before(f.End.Add(settle)) {
						nearFault = true
					}
				}
				if !nearFault {
					calm = append(calm, d)
				}
			}
		}
	}
	q := func(ds []time.Duration) string {
		if len(ds) == 0 {
			return "n/a"
		}
		sort.Slice(ds, func(a, b int) bool { return ds[a] < ds[b] })
		return fmt.Sprintf("p50 %v p99 %v max %v (n=%d)", ds[len(ds)/2].Round(time.Millisecond),
			ds[len(ds)*99/100].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond), len(ds))
	}
	return fmt.Sprintf("all: %s, worst %s; away from faults: %s", q(all), worstID, q(calm))
}

// whoAnswered lists the outputs of an input: worker, node, stream time.
func whoAnswered(j *journal, o *observed, topic, id string) string {
	var parts []string
	for _, out := range o.outputs[topic] {
		if out.in != id {
			continue
		}
		name := out.worker
		if w := j.workers[out.worker]; w != nil {
			name = w.name
		}
		parts = append(parts, fmt.Sprintf("%s on %s at %s", name, out.node, j.rel(out.at)))
	}
	if len(parts) == 0 {
		return "nobody"
	}
	return strings.Join(parts, ", ")
}

func deadsOf(o *observed, topic, id string) []string {
	var out []string
	for _, d := range o.deads[topic] {
		if d.id == id {
			out = append(out, d.worker+":"+d.reason)
		}
	}
	return out
}

// replayedWhileNotRunning tells whether dead letter d is a replay of a dead
// letter to w (ReplayDeadLetters, earlier) that reached a node while w was
// stopped or being stopped: the node dead-letters it again as not_running
// ("replayed for worker …, which is not running on topic …").
func replayedWhileNotRunning(j *journal, w *wrec, d dead) bool {
	if d.reason != "not_running" {
		return false
	}
	replayed := false
	for _, r := range j.replays {
		if r.worker == w.id && r.event == d.id && r.at.Before(d.at) {
			replayed = true
		}
	}
	if !replayed {
		return false
	}
	// The node may learn of a stop a little before the API answers it.
	for _, t := range []time.Time{d.at, d.at.Add(stopBound)} {
		if st, _, _ := w.at(t); st != running {
			return true
		}
	}
	return false
}

// pendingAtStop tells whether input in's entry was pending in the broker
// (delivered, not acked) just before the stop or delete of w that began at
// until: 1 yes, 0 no, -1 unknown (no snapshot of that stop).
func pendingAtStop(j *journal, w *wrec, in *input, until time.Time) int {
	for _, s := range j.pendingAt[w.id] {
		if !s.at.Before(until.Add(-5*time.Second)) && !s.at.After(until.Add(time.Second)) {
			if s.ids[in.sid] {
				return 1
			}
			return 0
		}
	}
	return -1
}

// backlogAtStop decides whether an input w never answered was still in
// w's backlog when w was stopped or deleted at until (so the stop dropped
// it) rather than acked without w before (a loss). With a snapshot of the
// broker's pending entries taken just before the stop, it is exactly
// whether the entry was pending then; without one, the heuristics: w
// answered nothing published later before the stop, or the input was
// still being worked on within settle of the stop.
func backlogAtStop(j *journal, o *observed, w *wrec, in *input, until time.Time) bool {
	switch pendingAtStop(j, w, in, until) {
	case 1:
		return true
	case 0:
		return false
	}
	return !answeredLater(o, w, in.at, until) || liveAt(o, w.topic, in, until.Add(-settle))
}

// liveAt reports whether input in was still being worked on at or after
// t: an output of it by any worker stored then, or its entry still pending
// in the broker. A message acked before t has its last outputs before t.
func liveAt(o *observed, topic string, in *input, t time.Time) bool {
	if _, ok := o.pel[topic][in.sid]; ok {
		return true
	}
	for _, out := range o.outputs[topic] {
		if out.in == in.id && !out.at.Before(t) {
			return true
		}
	}
	return false
}

// answeredLater reports whether w answered, before until, an input of its
// topic published after t: then it had gone past t in its backlog.
func answeredLater(o *observed, w *wrec, t, until time.Time) bool {
	for _, out := range o.outputs[w.topic] {
		if out.worker != w.id || !out.at.Before(until) {
			continue
		}
		if in := o.byInput[w.topic][out.in]; in != nil && in.at.After(t) {
			return true
		}
	}
	return false
}

// lifecycleKinds maps each lifecycle call to the event it announces.
var lifecycleKinds = map[string]lifecycleevents.Kind{
	"CreateWorker": lifecycleevents.Created, "StartWorker": lifecycleevents.Started, "StopWorker": lifecycleevents.Stopped,
	"DeleteWorker": lifecycleevents.Deleted, "LoadCode": lifecycleevents.CodeUpdated, "RollbackWorker": lifecycleevents.CodeUpdated,
}

// lifecycleAnnounced checks the lifecycle topic (workmanager.lifecycle,
// what a user subscribes to): every lifecycle call the API answered OK has
// its event for that worker ("created" for CreateWorker, "code_updated"
// for LoadCode and RollbackWorker, …), however many faults the change
// met. A change a live node did not apply fails the call (NotApplied) and
// is announced only when it is repeated and applied; the harness repeats
// failed calls, so an answered call is announced. The figures line counts
// the events by kind.
func lifecycleAnnounced(j *journal, events []entry) (*invariant, string) {
	iv := &invariant{name: "every lifecycle call answered OK has its event on " + lifecycleevents.Topic}
	seen := map[string]map[lifecycleevents.Kind]int{} // worker id → kind → events
	kinds := map[lifecycleevents.Kind]int{}
	for _, e := range events {
		k, ok := strings.CutPrefix(e.str("type"), lifecycleevents.TypePrefix)
		if !ok {
			continue
		}
		kind := lifecycleevents.Kind(k)
		kinds[kind]++
		id, _ := e.data()["worker_id"].(string)
		if seen[id] == nil {
			seen[id] = map[lifecycleevents.Kind]int{}
		}
		seen[id][kind]++
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	codeChanges := map[string]int{} // worker id → answered loads and rollbacks
	for _, a := range j.answered {
		iv.checked++
		kind := lifecycleKinds[a.what]
		if kind == lifecycleevents.CodeUpdated {
			codeChanges[a.id]++
		}
		if seen[a.id][kind] == 0 {
			iv.fail("%s of %s(%s) answered at %s: no %q event for it on %s (its events: %v)",
				a.what, a.name, a.id, j.rel(a.at), kind, lifecycleevents.Topic, seen[a.id])
		}
	}
	// A code_updated event per answered load or rollback, not just one:
	// each is a new version.
	for id, n := range codeChanges {
		if got := seen[id][lifecycleevents.CodeUpdated]; got > 0 && got < n {
			iv.fail("worker %s: %d code changes answered, %d code_updated events", id, n, got)
		}
	}
	return iv, fmt.Sprintf("lifecycle events by kind: %v", kinds)
}

// servedAfterConvergence is the rule that no node serves a worker the API
// does not list as running once the cluster converged (issue 43: a node
// woken from a pause with a stale view, or a stale activity attempt,
// must not bring a deleted or stopped worker back): every output Redis
// took later than stopBound after converged is by a worker that
// ListWorkers listed RUNNING at convergence (running: its ids); a worker
// unknown to the journal counts too.
func servedAfterConvergence(j *journal, o *observed, topics []string, running map[string]bool, converged time.Time) *invariant {
	iv := &invariant{name: "after convergence, outputs only by workers ListWorkers lists as RUNNING"}
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, topic := range topics {
		for _, out := range o.outputs[topic] {
			if out.at.Sub(converged) <= stopBound {
				continue
			}
			iv.checked++
			if !running[out.worker] {
				name := out.worker
				if w := j.workers[out.worker]; w != nil {
					name = idOf(w) + " (journal: " + w.current().String() + ")"
				}
				iv.fail("output %s by %s (node %s) at %s: not listed as RUNNING at convergence (%s)", out.id, name, out.node, j.rel(out.at), j.rel(converged))
			}
		}
	}
	return iv
}
