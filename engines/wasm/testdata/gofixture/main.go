// Command gofixture is the conformance suite's worker in Go (built by the
// wasm engine's tests with GOOS=wasip1 GOARCH=wasm -buildmode=c-shared).
// One module serves as every fixture, so that it is compiled once (the
// race detector makes wazero's compiler slow): its mode comes from the
// worker's id, which the suite names after the fixture ("conformance-multi",
// "conformance-hang-ctx", ...): "multi", "none", "raise" (fails with "boom"
// on conformance.raise), "hang" (loops for ever on conformance.hang), Echo
// otherwise, as enginetest.Fixtures describes them.
package main

import (
	"encoding/json"
	"errors"
	"strings"

	"github.com/virtufin/workmanager/sdk/wasm/wmwasm"
)

// mode is the fixture this instance plays.
var mode string

var spin int

func echo(ev *wmwasm.Event) ([]wmwasm.Output, error) {
	var corr any
	if c := ev.CorrelationID(); c != "" {
		corr = c
	}
	data := json.RawMessage("null")
	if len(ev.Data) > 0 {
		data = ev.Data
	}
	b, err := json.Marshal(map[string]any{"id": ev.ID, "data": data, "correlationid": corr})
	if err != nil {
		return nil, err
	}
	return []wmwasm.Output{ev.Reply("conformance.echo", b)}, nil
}

func handle(ev *wmwasm.Event) ([]wmwasm.Output, error) {
	switch mode {
	case "multi":
		return []wmwasm.Output{{Type: "conformance.a"}, {Type: "conformance.b"}}, nil
	case "none":
		return nil, nil
	case "raise":
		if ev.Type == "conformance.raise" {
			return nil, errors.New("boom")
		}
	case "hang":
		if ev.Type == "conformance.hang" {
			for {
				spin++
			}
		}
	}
	return echo(ev)
}

func init() {
	id, _, _ := wmwasm.Identity()
	for _, m := range []string{"multi", "none", "raise", "hang"} {
		if strings.Contains(id, m) {
			mode = m
		}
	}
	wmwasm.Handle(handle)
}

func main() {}
