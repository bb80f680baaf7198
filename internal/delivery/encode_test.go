package delivery

import (
	"encoding/json"
	"fmt"
	"testing"
)

// records are delivery records of every shape the hot path writes, and
// strings encoding/json escapes.
func records() []Record {
	return []Record{
		{},
		{Workers: map[string]Worker{}},
		{Workers: map[string]Worker{"w1": {Outcome: Done}}},
		{Workers: map[string]Worker{
			"tenant-a/9f0c6f4e-1b2c-4d3e-8f00-000000000001": {Attempts: 2, NextMS: 1764521234567},
			"byname-echo": {Outcome: Dead, Attempts: 5, Reason: "max-attempts", Error: `process: ValueError("bad <input> & \"quotes\"")` + "\n\ttraceback"},
			"w0":          {NotRunnable: 3, FirstNotRunnableMS: -1, Outcome: Pending},
			"":            {},
		}},
		{Workers: map[string]Worker{"é\u2028x": {Error: "bytes \xff\xfe not UTF-8, \x00 and \x7f", Reason: "timeout"}}},
	}
}

func TestAppendJSONIsJSONMarshal(t *testing.T) {
	for i, r := range records() {
		want, err := json.Marshal(&r)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.appendJSON(nil); string(got) != string(want) {
			t.Errorf("record %d:\n got %s\nwant %s", i, got, want)
		}
	}
}

// FuzzAppendJSON compares the two encodings on a record of two workers
// with any strings and numbers.
func FuzzAppendJSON(f *testing.F) {
	f.Add("w1", "w2", "done", "max-attempts", "boom", 3, int64(1), int64(2), 1)
	f.Add("<", "\u2028", "\xff", "", "\"\\", -1, int64(-5), int64(0), 0)
	f.Fuzz(func(t *testing.T, id1, id2, outcome, reason, errText string, attempts int, next, first int64, nr int) {
		r := Record{Workers: map[string]Worker{
			id1: {Outcome: Outcome(outcome), Attempts: attempts, NextMS: next, Reason: reason},
			id2: {Error: errText, FirstNotRunnableMS: first, NotRunnable: nr},
		}}
		want, err := json.Marshal(&r)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.appendJSON(nil); string(got) != string(want) {
			t.Fatalf("\n got %s\nwant %s", got, want)
		}
	})
}

// BenchmarkRecordEncode is a settled message's record (one worker done),
// and one of four workers, through json.Marshal (the baseline) and
// appendJSON.
func BenchmarkRecordEncode(b *testing.B) {
	for _, n := range []int{1, 4} {
		r := Record{Workers: map[string]Worker{}}
		for i := range n {
			r.Workers[fmt.Sprintf("tenant-a/9f0c6f4e-1b2c-4d3e-8f00-00000000000%d", i)] = Worker{Outcome: Done, Attempts: 1}
		}
		b.Run(fmt.Sprintf("json.Marshal/workers=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				if _, err := json.Marshal(&r); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("appendJSON/workers=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				_ = r.appendJSON(make([]byte, 0, 128))
			}
		})
	}
}
