package chaos

import (
	"sort"
	"strings"
	"testing"
	"time"
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
		o.inputs["t"] = []input{{id: "m1", at: at(1), copies: 1}, {id: "m2", at: at(2), copies: 1}, {id: "bad", at: at(3), poison: true, copies: 1}}
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
		}
		o.deads["t"] = []dead{{id: "bad", worker: "P", reason: "worker_failed", at: at(4)}}
		if broken {
			// m2 never answered by P nor B; B's m2 ran inside A's with an
			// older token; a dead letter of a healthy input; an output of
			// the stopped worker long after its stop.
			o.outputs["t"] = append(o.outputs["t"], out("m2", "B", 2.3, "2", 2.12, 2.14), out("m2", "S", 200, "", 0, 0))
			o.deads["t"] = append(o.deads["t"], dead{id: "m1", worker: "S", reason: "internal", at: at(5)})
			o.outputs["t"] = removeOutput(o.outputs["t"], "m2/P/0")
		} else {
			o.outputs["t"] = append(o.outputs["t"], out("m2", "P", 2.1, "", 0, 0), out("m2", "B", 2.3, "4", 2.16, 2.2))
		}
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
		"no loss":                 "m2 on t (published t+2.0s) never answered by py(P)",
		"dead letters only":       `dead letter of m1 on t for worker stopper(S) at t+5.0s: reason "internal"`,
		"no overlap":              "group g: m2/B/0",
		"fencing":                 "group g: token 2 on output m2/B/0",
		"no outputs by stopped":   "output m2/S/0 by stopper(S) at t+200.0s: stopped since t+100.0s",
		"poison events dead-lett": "",
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
