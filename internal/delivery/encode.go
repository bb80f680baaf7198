package delivery

import (
	"encoding/json"
	"slices"
	"strconv"
)

// appendJSON appends r as encoding/json writes it (map keys sorted, the
// Worker fields in order, empty ones left out), byte for byte. The hot path
// writes a record per message: json.Marshal's reflection over the map grew
// each settling goroutine's stack and was 6 % of the node's CPU in a
// keyed group's profile (docs/performance.md); TestAppendJSONIsJSONMarshal
// holds the two equal.
func (r *Record) appendJSON(b []byte) []byte {
	if r.Workers == nil {
		return append(b, `{"w":null}`...)
	}
	b = append(b, `{"w":{`...)
	ids := make([]string, 0, len(r.Workers))
	for id := range r.Workers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, id)
		b = append(b, ':')
		b = r.Workers[id].appendJSON(b)
	}
	return append(b, "}}"...)
}

func (w Worker) appendJSON(b []byte) []byte {
	b = append(b, '{')
	first := true
	field := func(name string) {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, '"')
		b = append(b, name...)
		b = append(b, `":`...)
	}
	if w.Outcome != "" {
		field("o")
		b = appendString(b, string(w.Outcome))
	}
	if w.Attempts != 0 {
		field("a")
		b = strconv.AppendInt(b, int64(w.Attempts), 10)
	}
	if w.NotRunnable != 0 {
		field("nr")
		b = strconv.AppendInt(b, int64(w.NotRunnable), 10)
	}
	if w.FirstNotRunnableMS != 0 {
		field("nrf")
		b = strconv.AppendInt(b, w.FirstNotRunnableMS, 10)
	}
	if w.NextMS != 0 {
		field("n")
		b = strconv.AppendInt(b, w.NextMS, 10)
	}
	if w.Reason != "" {
		field("r")
		b = appendString(b, w.Reason)
	}
	if w.Error != "" {
		field("e")
		b = appendString(b, w.Error)
	}
	return append(b, '}')
}

// appendString appends s quoted as encoding/json quotes it: printable
// ASCII that needs no escape is copied; anything else (an error text's
// quotes, control characters, HTML characters, non-ASCII) goes through
// json.Marshal, so the escaping is always the library's.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
