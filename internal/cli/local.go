package cli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/spf13/cobra"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/localrun"
)

// maxLocalFile bounds the event, expectation and stub files `run` reads.
const maxLocalFile = 16 << 20

func (a *app) runCmd() *cobra.Command {
	var (
		mime, expect, stubs, workerID, topic, group string
		eventFiles, eventsFiles, allowed            []string
	)
	cmd := &cobra.Command{
		Use:   "run FILE --event EVENT.json [flags]",
		Short: "Run a worker's code on events locally, through the node's engines (no cluster)",
		Long: `Run a worker's code on this machine, through the node's own engines in this
process (the Python runner, the .NET host on Mono, the native loader; a
native worker runs in bin/native-host when it is next to wmctl), and print
one JSON line per event: {"event_id", "ok", "outputs": [...]} or, when the
event failed, {"event_id", "ok": false, "outputs": [], "error", "reason"}
(reason as the node's dead letters: worker_failed, output_policy,
output_limit, timeout). Outputs are completed as on the node (id, source
workmanager/workers/<worker id>, the input's correlation id) and held to
the output policy (--allowed-output-topics, reserved topics, the input
topic) and limits. FILE and its MIME type as for create. Nothing of the
cluster is needed; not reproduced: the OS sandbox, group locks, retries.

Events (--event FILE, "-" for standard input, repeatable; --events FILE
with one event per line) are CloudEvents in structured JSON; they may
leave out specversion (1.0), source (local) and id (a new UUID).

--expect FILE checks the outputs: one JSON value per event, in order: the
array of outputs expected (each an object whose members must equal the
output's; data is compared as JSON; as many as the worker returned), or
{"error": "text"} for an event expected to fail with text in its error.

--gateway-stub FILE answers gateway calls: {"service/method": <JSON
response>, ...}; {"$error": "text"} fails the call.

Exit status: 0 every event ok (and as expected), 1 otherwise, 2 usage and
unreadable files, 5 code that does not load (the engine's message).`,
		Example: `  wmctl run worker.py --event event.json
  wmctl run Greeter.cs --event event.json --expect expected.json
  wmctl run build/echo.zip --events events.jsonl --gateway-stub stubs.json --allowed-output-topics 'orders.*'`,
		Args: cobra.ExactArgs(1),
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			code, err := os.ReadFile(args[0])
			if err != nil {
				return usageErr(fmt.Errorf("code: %w", err))
			}
			if mime == "" {
				if mime, err = InferMIME(args[0], code); err != nil {
					return usageErr(err)
				}
			}
			events, err := a.readEvents(eventFiles, eventsFiles)
			if err != nil {
				return usageErr(err)
			}
			var expected []json.RawMessage
			if expect != "" {
				if expected, err = readJSONValues(expect); err != nil {
					return usageErr(fmt.Errorf("--expect: %w", err))
				}
				if len(expected) != len(events) {
					return usageErr(fmt.Errorf("--expect %s has %d values for %d events", expect, len(expected), len(events)))
				}
			}
			opts := localrun.Options{MIMEType: mime, WorkerID: workerID, Topic: topic, Group: group, AllowedOutputs: allowed,
				Timeout: a.cfg.Timeout, Logger: slog.New(slog.NewTextHandler(a.io.Err, nil))}
			if stubs != "" {
				b, err := readLimited(stubs)
				if err == nil {
					err = json.Unmarshal(b, &opts.Stubs)
				}
				if err != nil {
					return usageErr(fmt.Errorf("--gateway-stub: %w", err))
				}
			}
			r, err := localrun.Start(cmd.Context(), code, opts)
			if errors.Is(err, engines.ErrInvalidCode) {
				return &localError{code: ExitInvalid, err: fmt.Errorf("%s does not load: %w", args[0], sourceNamedText(err, args[0]))}
			}
			if err != nil {
				return err
			}
			defer r.Close()
			failed := 0
			for i, ev := range events {
				res := r.Run(cmd.Context(), ev)
				line, err := json.Marshal(res)
				if err != nil {
					return err
				}
				fmt.Fprintln(a.io.Out, string(line))
				switch {
				case expected != nil: // an event may be expected to fail
					if msg := checkExpected(expected[i], res); msg != "" {
						fmt.Fprintf(a.io.Err, "wmctl: event %s: %s\n", res.EventID, msg)
						failed++
					}
				case !res.OK:
					failed++
				}
			}
			if failed > 0 {
				what := "failed"
				if expected != nil {
					what = "were not as expected"
				}
				return &localError{code: ExitError, err: fmt.Errorf("%d of %d events %s", failed, len(events), what)}
			}
			return nil
		}),
	}
	f := cmd.Flags()
	f.StringArrayVar(&eventFiles, "event", nil, `an event file (JSON), "-" for standard input; repeatable`)
	f.StringArrayVar(&eventsFiles, "events", nil, "a file of events, one JSON event per line")
	f.StringVar(&expect, "expect", "", "check the outputs against this file (see above)")
	f.StringVar(&stubs, "gateway-stub", "", `gateway responses: {"service/method": <JSON>, ...}`)
	f.StringVar(&mime, "mime", "", "MIME type (default: told from FILE)")
	f.StringVar(&workerID, "worker-id", "local", "the worker's id (output ids and source)")
	f.StringVar(&topic, "topic", "local", "the worker's input topic")
	f.StringVar(&group, "group", "", "the worker's group")
	f.StringSliceVar(&allowed, "allowed-output-topics", nil, "topics (patterns) the worker may publish to; default any but its input topic")
	return cmd
}

// localError is a local command's failure with its own exit code.
type localError struct {
	code int
	err  error
}

func (e *localError) Error() string { return e.err.Error() }
func (e *localError) Unwrap() error { return e.err }

// sourceNamedText replaces the .NET engine's name for a C# source in err's
// text with the file's (as sourceNamed does for API answers).
func sourceNamedText(err error, name string) error {
	if !strings.EqualFold(filepath.Ext(name), ".cs") {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), dotnetSourceName+":", filepath.Base(name)+":"))
}

func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxLocalFile+1))
	if err == nil && len(b) > maxLocalFile {
		err = fmt.Errorf("%s is larger than %d bytes", path, maxLocalFile)
	}
	return b, err
}

// readEvents reads the --event and --events files.
func (a *app) readEvents(single, lines []string) ([]*event.Event, error) {
	var out []*event.Event
	for _, p := range single {
		var b []byte
		var err error
		if p == "-" {
			b, err = io.ReadAll(io.LimitReader(a.io.In, maxLocalFile))
		} else {
			b, err = readLimited(p)
		}
		if err != nil {
			return nil, fmt.Errorf("--event: %w", err)
		}
		ev, err := localrun.ParseEvent(b)
		if err != nil {
			return nil, fmt.Errorf("--event %s: %w", p, err)
		}
		out = append(out, ev)
	}
	for _, p := range lines {
		b, err := readLimited(p)
		if err != nil {
			return nil, fmt.Errorf("--events: %w", err)
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(nil, maxLocalFile)
		for n := 1; sc.Scan(); n++ {
			if strings.TrimSpace(sc.Text()) == "" {
				continue
			}
			ev, err := localrun.ParseEvent(sc.Bytes())
			if err != nil {
				return nil, fmt.Errorf("--events %s line %d: %w", p, n, err)
			}
			out = append(out, ev)
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("--events %s: %w", p, err)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no events: give --event FILE or --events FILE")
	}
	return out, nil
}

// readJSONValues reads a file of JSON values one after the other.
func readJSONValues(path string) ([]json.RawMessage, error) {
	b, err := readLimited(path)
	if err != nil {
		return nil, err
	}
	var out []json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(b))
	for {
		var v json.RawMessage
		if err := dec.Decode(&v); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("%s: value %d: %w", path, len(out)+1, err)
		}
		out = append(out, v)
	}
}

// checkExpected compares a result with its expectation and says what
// differs ("" when nothing does).
func checkExpected(want json.RawMessage, res localrun.Result) string {
	var failure struct {
		Error *string `json:"error"`
	}
	if bytes.HasPrefix(bytes.TrimSpace(want), []byte("{")) {
		if err := json.Unmarshal(want, &failure); err != nil || failure.Error == nil {
			return `an expectation is an array of outputs or {"error": "text"}`
		}
		switch {
		case res.OK:
			return fmt.Sprintf("expected a failure with %q, but it succeeded", *failure.Error)
		case !strings.Contains(res.Error, *failure.Error):
			return fmt.Sprintf("expected a failure with %q, got %q", *failure.Error, res.Error)
		}
		return ""
	}
	var outs []map[string]any
	if err := json.Unmarshal(want, &outs); err != nil {
		return `an expectation is an array of outputs or {"error": "text"}: ` + err.Error()
	}
	if !res.OK {
		return "expected outputs, but it failed: " + res.Error
	}
	if len(outs) != len(res.Outputs) {
		return fmt.Sprintf("expected %d outputs, got %d", len(outs), len(res.Outputs))
	}
	for i, w := range outs {
		b, err := json.Marshal(res.Outputs[i])
		if err != nil {
			return err.Error()
		}
		var got map[string]any
		if err := json.Unmarshal(b, &got); err != nil {
			return err.Error()
		}
		for k, v := range w {
			if !reflect.DeepEqual(v, got[k]) {
				wb, _ := json.Marshal(v)
				gb, _ := json.Marshal(got[k])
				return fmt.Sprintf("output %d: %s: expected %s, got %s", i, k, wb, gb)
			}
		}
	}
	return ""
}
