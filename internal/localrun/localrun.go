// Package localrun runs a worker's code on events on this machine, through
// the node's own engines (engines/builtin: the Python runner, the .NET host
// on Mono, the native loader) in this process, without a cluster: what
// `wmctl run` does. Outputs are completed (id, source, correlation id) and
// held to the output policy and limits the way the node does it; not
// reproduced: the OS sandbox, group locks, retries and dead letters.
package localrun

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/google/uuid"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/builtin"
	"github.com/virtufin/workmanager/engines/dotnet"
	"github.com/virtufin/workmanager/engines/native"
	"github.com/virtufin/workmanager/internal/workerpolicy"
	pydevkit "github.com/virtufin/workmanager/sdk/python"
)

// Options shape a local run.
type Options struct {
	// MIMEType of the code (required).
	MIMEType string
	// WorkerID, Topic and Group are the worker's identity (defaults:
	// "local", "local", none).
	WorkerID, Topic, Group string
	// AllowedOutputs are the worker's allowed_output_topics patterns.
	AllowedOutputs []string
	// Timeout bounds one event (default 30 s).
	Timeout time.Duration
	// Stubs answer gateway calls: "service/method" to a JSON response, or
	// {"$error": "text"} to fail the call.
	Stubs map[string]json.RawMessage
	// CacheDir keeps what is worth keeping between runs: the Python DevKit,
	// the compiled .NET host and C# workers (default: the user's cache
	// directory, workmanager/).
	CacheDir string
	// Logger receives the worker's own log lines and the engines' records.
	Logger *slog.Logger
	// MaxOutputs and MaxOutputBytes are the node's output limits (defaults
	// 100 and 1 MiB).
	MaxOutputs, MaxOutputBytes int
}

// Result is what happened to one event, one JSON line of `wmctl run`.
type Result struct {
	EventID string        `json:"event_id"`
	OK      bool          `json:"ok"`
	Outputs []event.Event `json:"outputs"`
	// Error and Reason (the node's dead-letter reason: worker_failed,
	// output_policy, output_limit, output_invalid, timeout) when not OK.
	Error  string `json:"error,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// Runner holds one loaded worker.
type Runner struct {
	opts Options
	reg  *engines.Registry
	inst engines.Instance
}

// Start checks and loads code as the node would (Check, then Load). Code
// that does not load is an error wrapping engines.ErrInvalidCode.
func Start(ctx context.Context, code []byte, o Options) (*Runner, error) {
	o.WorkerID = cmpOr(o.WorkerID, "local")
	o.Topic = cmpOr(o.Topic, "local")
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	if o.MaxOutputs <= 0 {
		o.MaxOutputs = 100
	}
	if o.MaxOutputBytes <= 0 {
		o.MaxOutputBytes = 1 << 20
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if o.CacheDir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			base = os.TempDir()
		}
		o.CacheDir = filepath.Join(base, "workmanager")
	}
	cfg := builtin.Config{Logger: o.Logger, PythonProcesses: 1, DefaultTimeout: o.Timeout, Gateway: stubGateway(o.Stubs),
		MaxOutputs: o.MaxOutputs, MaxOutputBytes: o.MaxOutputBytes,
		Dotnet: dotnet.Config{CacheDir: filepath.Join(o.CacheDir, "dotnet")}}
	if o.MIMEType == engines.MIMEPython {
		dir, err := pydevkit.Install(filepath.Join(o.CacheDir, "python"))
		if err != nil {
			return nil, err
		}
		cfg.PythonDevKitDir = dir
	}
	// A native worker runs in a host process of its own when the native
	// host is at hand (make build puts it next to wmctl): a crash then
	// fails the event, not the run.
	if exe, err := os.Executable(); err == nil {
		if host := filepath.Join(filepath.Dir(exe), "native-host"); isFile(host) {
			cfg.NativeIsolation, cfg.NativeHostPath = native.IsolationProcess, host
		}
	}
	reg, err := builtin.Registry(cfg)
	if err != nil {
		return nil, err
	}
	eng, err := reg.Lookup(o.MIMEType)
	if err != nil {
		return nil, err
	}
	spec := engines.Spec{WorkerID: o.WorkerID, MIMEType: o.MIMEType, Topic: o.Topic, Group: o.Group, Timeout: o.Timeout, Logger: o.Logger}
	r := &Runner{opts: o, reg: reg}
	if err := eng.Check(ctx, spec, code); err != nil {
		r.Close()
		return nil, err
	}
	if r.inst, err = eng.Load(ctx, spec, code); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// Close unloads the worker and stops the engines' processes.
func (r *Runner) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r.inst != nil {
		_ = r.inst.Close(ctx)
	}
	_ = builtin.Close(r.reg)
}

// Run sends one event to the worker and completes and checks its outputs.
func (r *Runner) Run(ctx context.Context, in *event.Event) Result {
	res := Result{EventID: in.ID(), Outputs: []event.Event{}}
	ctx, cancel := context.WithTimeout(ctx, r.opts.Timeout)
	defer cancel()
	outs, err := r.inst.Process(ctx, in)
	if err != nil {
		res.Error, res.Reason = err.Error(), "worker_failed"
		switch {
		case errors.Is(err, engines.ErrTimeout) || errors.Is(err, context.DeadlineExceeded):
			res.Reason = "timeout"
		case errors.Is(err, engines.ErrInvalidOutput):
			res.Reason = "output_invalid"
		}
		return res
	}
	if reason, err := r.complete(in, outs); err != nil {
		res.Error, res.Reason = err.Error(), reason
		return res
	}
	res.OK, res.Outputs = true, outs
	return res
}

// complete does what the node does to outputs (internal/dispatch,
// checkOutputs): the default id and source, the input's correlation id,
// no control extensions, the output policy and limits.
func (r *Runner) complete(in *event.Event, outs []event.Event) (string, error) {
	if n := len(outs); n > r.opts.MaxOutputs {
		return "output_limit", fmt.Errorf("%w: %d outputs, more than MAX_OUTPUTS_PER_MESSAGE %d", engines.ErrWorkerFailed, n, r.opts.MaxOutputs)
	}
	base := in.ID()
	if len(base) > 64 {
		sum := sha256.Sum256([]byte(base))
		base = "sha256:" + hex.EncodeToString(sum[:16])
	}
	tag := sha256.Sum256([]byte(in.Source()))
	corr, hasCorr := in.Extensions()["correlationid"]
	source := url.URL{Path: "workmanager/workers/" + r.opts.WorkerID}
	for i := range outs {
		o := &outs[i]
		if o.Type() == "" {
			return "output_invalid", fmt.Errorf("%w: %w: output %d has no type", engines.ErrWorkerFailed, engines.ErrInvalidOutput, i)
		}
		if o.ID() == "" {
			o.SetID(base + "/" + r.opts.WorkerID + "/" + strconv.Itoa(i) + "/" + hex.EncodeToString(tag[:4]))
		}
		if o.Source() == "" {
			o.SetSource(source.String())
		}
		for k := range o.Extensions() {
			if k == "fencingtoken" || strings.HasPrefix(k, "workmanager") || strings.HasPrefix(k, "deadletter") {
				delete(o.Context.(*event.EventContextV1).Extensions, k)
			}
		}
		if hasCorr {
			o.SetExtension("correlationid", corr)
		} else if ec, ok := o.Context.(*event.EventContextV1); ok {
			delete(ec.Extensions, "correlationid")
		}
		if err := workerpolicy.CheckOutput("", r.opts.AllowedOutputs, r.opts.Topic, o.Type()); err != nil {
			return "output_policy", fmt.Errorf("%w: output %d: %w", engines.ErrWorkerFailed, i, err)
		}
		if n := len(o.Data()); n > r.opts.MaxOutputBytes {
			return "output_limit", fmt.Errorf("%w: output %d: %d bytes of data, more than MAX_OUTPUT_BYTES %d", engines.ErrWorkerFailed, i, n, r.opts.MaxOutputBytes)
		}
	}
	return "", nil
}

// ParseEvent reads a CloudEvent in structured JSON form; it may leave out
// specversion (1.0), source ("local") and id (a new UUID); data without a
// datacontenttype is application/json (text/plain for a string).
func ParseEvent(b []byte) (*event.Event, error) {
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	if m == nil {
		return nil, errors.New("not a JSON object")
	}
	if _, ok := m["type"].(string); !ok {
		return nil, errors.New(`the event has no "type"`)
	}
	setDefault(m, "specversion", "1.0")
	setDefault(m, "source", "local")
	setDefault(m, "id", uuid.NewString())
	if d, ok := m["data"]; ok && m["datacontenttype"] == nil {
		if _, isText := d.(string); isText {
			m["datacontenttype"] = "text/plain"
		} else {
			m["datacontenttype"] = "application/json"
		}
	}
	full, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	ev := event.New()
	if err := json.Unmarshal(full, &ev); err != nil {
		return nil, err
	}
	if err := ev.Validate(); err != nil {
		return nil, err
	}
	return &ev, nil
}

func setDefault(m map[string]any, k string, v any) {
	if _, ok := m[k]; !ok {
		m[k] = v
	}
}

// stubGateway answers gateway calls from stubs.
type stubGateway map[string]json.RawMessage

func (g stubGateway) Call(_ context.Context, service, method string, _ []byte) ([]byte, error) {
	resp, ok := g[service+"/"+method]
	if !ok {
		return nil, fmt.Errorf("no stub for %s/%s (wmctl run --gateway-stub)", service, method)
	}
	var fail struct {
		Error *string `json:"$error"`
	}
	if json.Unmarshal(resp, &fail) == nil && fail.Error != nil {
		return nil, errors.New(*fail.Error)
	}
	return resp, nil
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

func cmpOr(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
