//go:build linux || darwin || freebsd

package native

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/native/internal/loader"
)

func TestConformance(t *testing.T) {
	enginetest.Run(t, enginetest.Harness{
		Engine:   newTestEngine(t, Config{}),
		MIMEType: MIMEType,
		Fixtures: conformanceFixtures(t),
	})
}

func TestConformanceProcessIsolation(t *testing.T) {
	enginetest.Run(t, enginetest.Harness{
		Engine:   newTestEngine(t, hostConfig(Config{Isolation: IsolationProcess})),
		MIMEType: MIMEType,
		Fixtures: conformanceFixtures(t),
	})
}

func TestInfo(t *testing.T) {
	in := New(Config{}).Info()
	if !in.Capabilities.InProcess || in.Capabilities.Interruptible || in.Capabilities.ParallelCalls != DefaultMaxAbandonedCalls {
		t.Errorf("in-process capabilities = %+v", in.Capabilities)
	}
	out := New(Config{Isolation: IsolationProcess, HostProcesses: 3}).Info()
	if out.Capabilities.InProcess || !out.Capabilities.Interruptible || out.Capabilities.ParallelCalls != 3 {
		t.Errorf("process isolation capabilities = %+v", out.Capabilities)
	}
}

// --- bad packages --------------------------------------------------------

func TestBadPackages(t *testing.T) {
	compileAll(t, flagsEcho, flagsNoFree)
	lib := readFile(t, fixtureLib(t, flagsEcho...))
	libPath := libraryPath(hostRID, "fixture")
	m := func(extra map[string]any) entry { return entry{ManifestName, manifestJSON(extra)} }
	otherRID := "linux-arm64"
	if hostRID == otherRID {
		otherRID = "linux-x64"
	}
	cases := []struct {
		name string
		code func() []byte
		want string
	}{
		{"empty", func() []byte { return nil }, "the package is empty"},
		{"not a zip", func() []byte { return []byte("def process(e): pass") }, "the package is not a valid zip archive"},
		{"too large", func() []byte { return make([]byte, MaxPackageSize+1) },
			fmt.Sprintf("the package is %d bytes, more than the limit of %d", MaxPackageSize+1, MaxPackageSize)},
		{"no manifest", func() []byte { return zipOf(t, entry{libPath, lib}) },
			"manifest.json is missing at the root of the package"},
		{"manifest not at the root", func() []byte { return zipOf(t, entry{"pkg/manifest.json", manifestJSON(nil)}, entry{libPath, lib}) },
			`manifest.json is missing at the root of the package (found "pkg/manifest.json": it must be at the root)`},
		{"two manifests", func() []byte { return zipOf(t, m(nil), m(nil), entry{libPath, lib}) },
			"the package has more than one manifest.json"},
		{"malformed JSON", func() []byte { return zipOf(t, entry{ManifestName, []byte(`{"abi_version": 1,`)}, entry{libPath, lib}) },
			"manifest.json is not valid JSON"},
		{"trailing data", func() []byte {
			return zipOf(t, entry{ManifestName, []byte(`{"abi_version":1,"library":"fixture"} {}`)}, entry{libPath, lib})
		},
			"manifest.json is not valid JSON: data after the top-level object"},
		{"abi_version missing", func() []byte { return zipOf(t, m(map[string]any{"abi_version": nil}), entry{libPath, lib}) },
			"manifest.json: abi_version is missing (supported: 1)"},
		{"abi_version not an integer", func() []byte { return zipOf(t, m(map[string]any{"abi_version": "1"}), entry{libPath, lib}) },
			`manifest.json: abi_version must be an integer, got "1"`},
		{"abi_version unsupported", func() []byte { return zipOf(t, m(map[string]any{"abi_version": 7}), entry{libPath, lib}) },
			"manifest.json: abi_version 7 is not supported (supported: 1)"},
		{"abi_version zero", func() []byte { return zipOf(t, m(map[string]any{"abi_version": 0}), entry{libPath, lib}) },
			"manifest.json: abi_version 0 is not supported (supported: 1)"},
		{"library missing", func() []byte { return zipOf(t, m(map[string]any{"library": nil}), entry{libPath, lib}) },
			"manifest.json: library is missing"},
		{"library empty", func() []byte { return zipOf(t, m(map[string]any{"library": ""}), entry{libPath, lib}) },
			"manifest.json: library is empty"},
		{"library path trick", func() []byte { return zipOf(t, m(map[string]any{"library": "../x"}), entry{libPath, lib}) },
			`manifest.json: library "../x" is not a valid name`},
		{"library with a slash", func() []byte { return zipOf(t, m(map[string]any{"library": "a/b"}), entry{libPath, lib}) },
			`manifest.json: library "a/b" is not a valid name`},
		{"library with dots", func() []byte { return zipOf(t, m(map[string]any{"library": "a..b"}), entry{libPath, lib}) },
			`manifest.json: library "a..b" is not a valid name`},
		{"library not a string", func() []byte { return zipOf(t, m(map[string]any{"library": 3}), entry{libPath, lib}) },
			"manifest.json is not valid JSON"},
		{"bad entry_point", func() []byte { return zipOf(t, m(map[string]any{"entry_point": "1x"}), entry{libPath, lib}) },
			`manifest.json: entry_point "1x" is not a valid C symbol name`},
		{"bad free_result", func() []byte { return zipOf(t, m(map[string]any{"free_result": "a b"}), entry{libPath, lib}) },
			`manifest.json: free_result "a b" is not a valid C symbol name`},
		{"bad isolation", func() []byte { return zipOf(t, m(map[string]any{"isolation": "vm"}), entry{libPath, lib}) },
			`manifest.json: isolation "vm" is not supported (supported: "in-process", "process")`},
		{"no library for this platform", func() []byte {
			return zipOf(t, m(nil), entry{libraryPath(otherRID, "fixture"), lib})
		}, fmt.Sprintf("no library for this platform: %s is not in the package (runtimes present: %s; supported: %s)",
			libPath, otherRID, strings.Join(supportedRIDs(), ", "))},
		{"no runtimes at all", func() []byte { return zipOf(t, m(nil), entry{"README", []byte("hi")}) },
			"is not in the package (runtimes present: none; supported: freebsd-arm64, freebsd-x64, linux-arm64, linux-x64"},
		{"library under another name", func() []byte {
			return zipOf(t, m(nil), entry{"runtimes/" + hostRID + "/native/libother.so", lib})
		}, fmt.Sprintf("(runtimes present: %s (without libfixture.so);", hostRID)},
		{"missing FreeResult", func() []byte {
			return zipOf(t, m(nil), entry{libPath, readFile(t, fixtureLib(t, flagsNoFree...))})
		}, `the library libfixture.so does not export FreeResult (ABI v1 needs the exports "Process" and "FreeResult"`},
		{"missing both exports", func() []byte {
			return zipOf(t, m(map[string]any{"entry_point": "Nope", "free_result": "Nada"}), entry{libPath, lib})
		}, `the library libfixture.so does not export Nope and Nada`},
		{"not a shared library", func() []byte { return zipOf(t, m(nil), entry{libPath, []byte("\x7fELF garbage")}) },
			"the library libfixture.so does not load:"},
		{"zip slip", func() []byte { return zipOf(t, m(nil), entry{libPath, lib}, entry{"../evil.so", lib}) },
			`zip entry "../evil.so" escapes the extraction directory`},
		{"zip slip inside runtimes", func() []byte {
			return zipOf(t, m(nil), entry{libPath, lib}, entry{"runtimes/" + hostRID + "/native/../../../../x", lib})
		}, "escapes the extraction directory"},
		{"absolute entry", func() []byte { return zipOf(t, m(nil), entry{libPath, lib}, entry{"/etc/x", lib}) },
			`zip entry "/etc/x" escapes the extraction directory`},
		{"backslash entry", func() []byte { return zipOf(t, m(nil), entry{libPath, lib}, entry{`..\x`, lib}) },
			`escapes the extraction directory`},
		{"symlink entry", func() []byte { return zipWithSymlink(t, m(nil), entry{libPath, lib}) },
			`zip entry "runtimes/` + hostRID + `/native/link.so" is a symbolic link (not allowed)`},
		{"too many entries", func() []byte {
			es := []entry{m(nil), {libPath, lib}}
			for i := range MaxEntries {
				es = append(es, entry{fmt.Sprintf("junk/%d", i), nil})
			}
			return zipOf(t, es...)
		}, fmt.Sprintf("the package has %d entries, more than the limit of %d", MaxEntries+2, MaxEntries)},
		{"declared size over the limit", func() []byte { return zipWithLyingSize(t, m(nil), entry{libPath, lib}, MaxUncompressedSize+1) },
			fmt.Sprintf("the package uncompresses to more than the limit of %d bytes (at entry \"big.bin\")", MaxUncompressedSize)},
		{"zip bomb", func() []byte {
			return zipOf(t, m(nil), entry{libPath, lib}, entry{"runtimes/" + hostRID + "/native/zeros.bin", make([]byte, 20<<20)})
		}, `zip entry "runtimes/` + hostRID + `/native/zeros.bin" has a compression ratio above the limit of 100`},
	}
	e := newTestEngine(t, Config{})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code := c.code()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err := e.Check(ctx, testSpec, code)
			checkInvalid(t, "Check", err, c.want)
			inst, err := e.Load(ctx, testSpec, code)
			if err == nil {
				inst.Close(ctx)
			}
			checkInvalid(t, "Load", err, c.want)
		})
	}
	// Nothing was left behind by the failures.
	if left, _ := extractionsIn(e); len(left) != 0 {
		t.Errorf("temp dir not empty after failed loads: %v", left)
	}
}

func checkInvalid(t *testing.T, what string, err error, want string) {
	t.Helper()
	if !errors.Is(err, engines.ErrInvalidCode) {
		t.Fatalf("%s = %v, want an error wrapping ErrInvalidCode", what, err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("%s = %q\nwant it to contain %q", what, err, want)
	}
}

// --- the ABI in action ---------------------------------------------------

// modes runs f for in-process and process isolation.
func modes(t *testing.T, f func(t *testing.T, cfg Config)) {
	t.Run("in-process", func(t *testing.T) { f(t, Config{}) })
	t.Run("process", func(t *testing.T) { f(t, hostConfig(Config{Isolation: IsolationProcess})) })
}

type fakeGateway struct {
	mu     sync.Mutex
	calls  []string
	fences []*engines.Fence // the group lock each call was made under
	fail   error
}

func (g *fakeGateway) Call(ctx context.Context, service, method string, req []byte) ([]byte, error) {
	g.mu.Lock()
	g.calls = append(g.calls, service+" "+method+" "+string(req))
	g.fences = append(g.fences, engines.FenceFrom(ctx))
	g.mu.Unlock()
	if _, ok := ctx.Deadline(); !ok {
		return nil, errors.New("gateway call without a deadline")
	}
	if g.fail != nil {
		return nil, g.fail
	}
	return []byte(`{"answer":42,"echo":` + string(req) + `}`), nil
}

func TestLogCallback(t *testing.T) {
	modes(t, func(t *testing.T, cfg Config) {
		rec := newRecorder()
		e := newTestEngine(t, cfg)
		spec := testSpec
		spec.Logger = slog.New(rec)
		inst := load(t, e, spec, packageOf(t, flagsEcho, nil))
		if out := mustCall(t, inst, typed("test.log", nil)); len(out) != 0 {
			t.Fatalf("got %d outputs", len(out))
		}
		want := []string{
			"DEBUG-4|w-native|log-0 from w-native",
			"DEBUG|w-native|log-1 from w-native",
			"INFO|w-native|log-2 from w-native",
			"WARN|w-native|log-3 from w-native",
			"ERROR|w-native|log-4 from w-native",
		}
		var got []string
		for _, l := range rec.lines() {
			if strings.Contains(l, "log-") {
				got = append(got, l)
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("log lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
}

func TestGatewayCallback(t *testing.T) {
	modes(t, func(t *testing.T, cfg Config) {
		gw := &fakeGateway{}
		cfg.Gateway = gw
		inst := load(t, newTestEngine(t, cfg), testSpec, packageOf(t, flagsEcho, nil))
		ev := typed("test.gateway", map[string]any{"q": "x"})
		ev.SetExtension("gwmethod", "v1/things")
		got := enginetest.DataOf(t, mustCall(t, inst, ev))
		if got["answer"] != 42.0 || !reflect.DeepEqual(got["echo"], map[string]any{"q": "x"}) {
			t.Fatalf("gateway result = %v", got)
		}
		if want := []string{`svc v1/things {"q":"x"}`}; !slices.Equal(gw.calls, want) {
			t.Fatalf("gateway calls = %q, want %q", gw.calls, want)
		}
		if gw.fences[0] != nil {
			t.Fatal("a call outside a group lock carried a fence")
		}

		// Under a group lock the gateway gets the call's fence.
		fence := &engines.Fence{Group: "g", Token: 9, Check: func(context.Context) error { return nil }}
		ctx, cancel := context.WithTimeout(engines.WithFence(context.Background(), fence), 30*time.Second)
		defer cancel()
		if _, err := inst.Process(ctx, ev); err != nil {
			t.Fatal(err)
		}
		if got := gw.fences[1]; got == nil || got.Token != 9 || got.Group != "g" {
			t.Fatalf("fence seen by the gateway %+v, want g/9", got)
		}

		// A failing gateway: the worker sees code 1 and the message.
		gw.fail = errors.New("backend says no")
		_, err := call(t, inst, typed("test.gateway", map[string]any{"q": "y"}))
		if !errors.Is(err, engines.ErrWorkerFailed) || !strings.Contains(err.Error(), "gateway code 1: backend says no") {
			t.Fatalf("Process with a failing gateway = %v", err)
		}
	})
}

func TestGatewayUnavailable(t *testing.T) {
	modes(t, func(t *testing.T, cfg Config) {
		inst := load(t, newTestEngine(t, cfg), testSpec, packageOf(t, flagsEcho, nil))
		_, err := call(t, inst, typed("test.gateway", map[string]any{"q": "y"}))
		if !errors.Is(err, engines.ErrWorkerFailed) || !strings.Contains(err.Error(), "gateway code 2: no gateway is configured on this node") {
			t.Fatalf("Process without a gateway = %v", err)
		}
	})
}

func TestIdentity(t *testing.T) {
	modes(t, func(t *testing.T, cfg Config) {
		t.Setenv(EnvWorkerID, "prior-id")
		os.Unsetenv(EnvWorkerGroup)
		inst := load(t, newTestEngine(t, cfg), testSpec, packageOf(t, flagsEcho, nil))
		got := enginetest.DataOf(t, mustCall(t, inst, typed("test.identity", nil)))
		want := map[string]any{"worker_id": "w-native", "group": "group-native", "topic": "topic-native",
			"env_worker_id": "w-native", "abi": 1.0, "size": float64(hostStructSize(t))}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("identity = %v, want %v", got, want)
		}
		closeNow(t, inst)
		if v := os.Getenv(EnvWorkerID); v != "prior-id" {
			t.Errorf("%s after Close = %q, want the prior value back", EnvWorkerID, v)
		}
		if v, ok := os.LookupEnv(EnvWorkerGroup); ok {
			t.Errorf("%s after Close = %q, want it unset again", EnvWorkerGroup, v)
		}
	})
}

// TestIdentityEnvStack shows why the environment is a weak channel: with
// two workers loaded in process, both see the identity of the last one.
func TestIdentityEnvStack(t *testing.T) {
	t.Setenv(EnvWorkerID, "prior-id")
	e := newTestEngine(t, Config{})
	code := packageOf(t, flagsEcho, nil)
	a, b := testSpec, testSpec
	a.WorkerID, b.WorkerID = "worker-a", "worker-b"
	ia := load(t, e, a, code)
	ib := load(t, e, b, code)
	ga := enginetest.DataOf(t, mustCall(t, ia, typed("test.identity", nil)))
	if ga["worker_id"] != "worker-a" || ga["env_worker_id"] != "worker-b" {
		t.Fatalf("worker a sees %v: want its own worker_id in the host struct and b's in the environment", ga)
	}
	closeNow(t, ib)
	if v := os.Getenv(EnvWorkerID); v != "worker-a" {
		t.Fatalf("after b unloads the environment says %q, want worker-a", v)
	}
	closeNow(t, ia)
	if v := os.Getenv(EnvWorkerID); v != "prior-id" {
		t.Fatalf("after both unload the environment says %q, want prior-id", v)
	}
}

// hostStructSize is sizeof(VirtufinHost) of the current ABI.
func hostStructSize(t testing.TB) int {
	t.Helper()
	abi, ok := loader.LookupABI(CurrentABI)
	if !ok {
		t.Fatalf("ABI %d is not in the table", CurrentABI)
	}
	return abi.HostStructSize
}

func closeNow(t testing.TB, inst engines.Instance) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := inst.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

func TestAllAttributesRoundTrip(t *testing.T) {
	modes(t, func(t *testing.T, cfg Config) {
		inst := load(t, newTestEngine(t, cfg), testSpec, packageOf(t, flagsEcho, nil))
		ev := event.New()
		ev.SetID("in-1")
		ev.SetSource("/src")
		ev.SetType("test.fields")
		ev.SetSubject("subj")
		ts := time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC)
		ev.SetTime(ts)
		ev.SetDataSchema("https://schema.example/x")
		ev.SetExtension("correlationid", "corr-9")
		ev.SetExtension("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
		ev.SetExtension("count", 3)
		if err := ev.SetData("text/plain", []byte("bytes \x00\x01\xff")); err != nil {
			t.Fatal(err)
		}
		out := mustCall(t, inst, &ev)
		if len(out) != 1 {
			t.Fatalf("got %d outputs", len(out))
		}
		o := out[0]
		checks := []struct{ name, got, want string }{
			{"id", o.ID(), "out-1"},
			{"source", o.Source(), "/fixture"},
			{"type", o.Type(), "test.fields.result"},
			{"specversion", o.SpecVersion(), "1.0"},
			{"subject", o.Subject(), "subj"},
			{"time", o.Time().Format(time.RFC3339Nano), ts.Format(time.RFC3339Nano)},
			{"dataschema", o.DataSchema(), "https://schema.example/x"},
			{"datacontenttype", o.DataContentType(), "text/plain"},
			{"data", string(o.Data()), "bytes \x00\x01\xff"},
			{"correlationid", fmt.Sprint(o.Extensions()["correlationid"]), "corr-9"},
			{"traceparent", fmt.Sprint(o.Extensions()["traceparent"]), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
			{"count", fmt.Sprint(o.Extensions()["count"]), "3"},
			{"fixture", fmt.Sprint(o.Extensions()["fixture"]), "yes"},
		}
		for _, c := range checks {
			if c.got != c.want {
				t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
			}
		}
		if err := o.Validate(); err != nil {
			t.Errorf("output does not validate: %v", err)
		}
	})
}

// TestWorkerErrorAnswers: error_message with return code 0 is the
// worker's error answer (engines.ErrorAnswer, with the outputs it gave as
// its error response), not a failure; with a non-zero code it stays one.
func TestWorkerErrorAnswers(t *testing.T) {
	modes(t, func(t *testing.T, cfg Config) {
		inst := load(t, newTestEngine(t, cfg), testSpec, packageOf(t, flagsEcho, nil))
		for typ, want := range map[string][]string{"test.answer": nil, "test.answerwith": {"test.refused"}} {
			out, err := call(t, inst, typed(typ, nil))
			var answer *engines.ErrorAnswer
			if !errors.As(err, &answer) || answer.Message != "no stock" || len(out) != 0 {
				t.Fatalf("%s: Process = %v, %v; want an ErrorAnswer \"no stock\"", typ, out, err)
			}
			var got []string
			for _, o := range answer.Outputs {
				got = append(got, o.Type())
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%s: error response %v, want %v", typ, got, want)
			}
		}
		_, err := call(t, inst, typed("test.codemsg", nil))
		var answer *engines.ErrorAnswer
		if errors.As(err, &answer) || !errors.Is(err, engines.ErrWorkerFailed) {
			t.Fatalf("test.codemsg: %v, want a failure, not an answer", err)
		}
	})
}

func TestWorkerFailures(t *testing.T) {
	modes(t, func(t *testing.T, cfg Config) {
		inst := load(t, newTestEngine(t, cfg), testSpec, packageOf(t, flagsEcho, nil))
		for _, c := range []struct{ typ, want string }{
			{"test.code", "worker failed: native worker returned code 7"},
			{"test.codemsg", "worker failed: native worker returned code 5: it went wrong"},
			{"test.badresponse", "worker failed: malformed response (16 bytes)"},
			{"test.badlen", "worker failed: the worker returned a response buffer with length 0"},
			{"test.notype", `worker failed: output 0: missing required attribute "type"`},
		} {
			_, err := call(t, inst, typed(c.typ, nil))
			var we *WorkerError
			if !errors.Is(err, engines.ErrWorkerFailed) || !errors.As(err, &we) {
				t.Fatalf("%s: Process = %v, want a *WorkerError wrapping ErrWorkerFailed", c.typ, err)
			}
			if !strings.HasPrefix(err.Error(), c.want) {
				t.Fatalf("%s: Process = %q, want it to start with %q", c.typ, err, c.want)
			}
			// Only outputs that cannot be published are ErrInvalidOutput
			// (dead-lettered at once): a worker's own error code is not.
			if invalid := c.typ == "test.notype"; errors.Is(err, engines.ErrInvalidOutput) != invalid {
				t.Fatalf("%s: Process = %v, matches ErrInvalidOutput: %v, want %v", c.typ, err, !invalid, invalid)
			}
		}
		// FreeResult was called once for every buffer the worker returned
		// (the counts are taken before the stats response is built).
		got := enginetest.DataOf(t, mustCall(t, inst, typed("test.stats", nil)))
		if got["allocs"] != got["frees"] || got["allocs"] != 4.0 {
			t.Fatalf("allocs/frees = %v, want 4 buffers returned and freed", got)
		}
		// And the instance still serves.
		if out := mustCall(t, inst, typed("test.multi3", nil)); len(out) != 3 || out[0].Type() != "m.1" || out[2].Type() != "m.3" {
			t.Fatalf("multi3 = %v", out)
		}
	})
}

func TestCustomExportNames(t *testing.T) {
	flags := []string{"-DPROCESS_NAME=HandleEvent", "-DFREE_NAME=ReleaseBuffer"}
	e := newTestEngine(t, Config{})
	code := packageOf(t, flags, map[string]any{"entry_point": "HandleEvent", "free_result": "ReleaseBuffer"})
	inst := load(t, e, testSpec, code)
	in := enginetest.NewEvent("c-1", enginetest.TypeRequest, map[string]any{"a": 1}, "c")
	if out := mustCall(t, inst, in); len(out) != 1 || out[0].Type() != enginetest.TypeEcho {
		t.Fatalf("outputs = %v", out)
	}
	// The default names are not there.
	err := e.Check(context.Background(), testSpec, packageOf(t, flags, nil))
	checkInvalid(t, "Check", err, "does not export Process and FreeResult")
}

// TestReloadLoadsNewCode: two versions of a library with the same file name
// loaded side by side are two libraries (each Load has its own directory).
func TestReloadLoadsNewCode(t *testing.T) {
	compileAll(t, flagsEcho, flagsMulti)
	e := newTestEngine(t, Config{})
	v1 := load(t, e, testSpec, packageOf(t, flagsEcho, nil))
	v2 := load(t, e, testSpec, packageOf(t, flagsMulti, nil))
	in := enginetest.NewEvent("r-1", enginetest.TypeRequest, map[string]any{"a": 1}, "")
	if out := mustCall(t, v1, in); len(out) != 1 || out[0].Type() != enginetest.TypeEcho {
		t.Fatalf("v1 outputs = %v", out)
	}
	if out := mustCall(t, v2, in); len(out) != 2 {
		t.Fatalf("v2 outputs = %v", out)
	}
	closeNow(t, v1)
	if out := mustCall(t, v2, in); len(out) != 2 {
		t.Fatalf("v2 outputs after v1 closed = %v", out)
	}
}

// TestCloseReleasesEverything: after Close the library is unmapped and its
// extracted files are gone; Check leaves nothing behind either.
func TestCloseReleasesEverything(t *testing.T) {
	e := newTestEngine(t, Config{})
	code := packageOf(t, flagsEcho, nil)
	if err := e.Check(context.Background(), testSpec, code); err != nil {
		t.Fatal(err)
	}
	if left, _ := extractionsIn(e); len(left) != 0 {
		t.Fatalf("Check left %v in the temp dir", left)
	}
	inst := load(t, e, testSpec, code)
	mustCall(t, inst, typed("test.stats", nil))
	dirs, _ := extractionsIn(e)
	if len(dirs) != 1 {
		t.Fatalf("temp dir holds %v, want one extraction directory", dirs)
	}
	extracted := filepath.Join(e.owner.path(), dirs[0].Name())
	if runtime.GOOS == "linux" && !mapped(t, extracted) {
		t.Fatalf("the library in %s is not in /proc/self/maps while loaded", extracted)
	}
	closeNow(t, inst)
	if left, _ := extractionsIn(e); len(left) != 0 {
		t.Fatalf("Close left %v in the temp dir", left)
	}
	if runtime.GOOS == "linux" && mapped(t, extracted) {
		t.Fatalf("the library in %s is still mapped after Close (dlclose not called?)", extracted)
	}
	if _, err := call(t, inst, typed("test.stats", nil)); !errors.Is(err, engines.ErrClosed) {
		t.Fatalf("Process after Close = %v, want ErrClosed", err)
	}
	for _, cs := range inst.(*inprocInstance).all {
		if loader.Registered(cs.sinkID) {
			t.Fatal("an engine_ptr handle is still registered after Close")
		}
	}
}

func mapped(t *testing.T, dir string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Skip(err)
	}
	return strings.Contains(string(b), dir)
}

// TestCloseWaitsForCalls: Close waits for calls in native code; if its ctx
// ends first it returns an error and the library is unloaded once the call
// has returned.
func TestCloseWaitsForCalls(t *testing.T) {
	e := newTestEngine(t, Config{})
	code := packageOf(t, flagsEcho, nil)

	// inNative waits until a call holds one of inst's slots (it takes one
	// before it enters native code and gives it back when it returns):
	// a condition, not a sleep, which a loaded machine (-race beside the
	// integration tests) outran once.
	inNative := func(inst engines.Instance) *inprocInstance {
		in := inst.(*inprocInstance)
		deadline := time.Now().Add(time.Minute)
		for len(in.slots) == cap(in.slots) {
			if time.Now().After(deadline) {
				t.Fatal("the call never entered native code")
			}
			time.Sleep(time.Millisecond)
		}
		return in
	}
	inst := load(t, e, testSpec, code)
	res := make(chan error, 1)
	go func() { _, err := call(t, inst, typed("test.sleep", 300)); res <- err }()
	in := inNative(inst)
	closeNow(t, inst)
	if len(in.slots) != cap(in.slots) {
		t.Fatal("Close returned with a call still in native code")
	}
	if err := <-res; err != nil {
		t.Fatalf("the call in flight at Close failed: %v", err)
	}

	inst = load(t, e, testSpec, code)
	go func() { _, err := call(t, inst, typed("test.sleep", 2000)); res <- err }()
	inNative(inst)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	err := inst.Close(ctx)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "calls still running in native code") {
		t.Fatalf("Close with a short ctx = %v", err)
	}
	if err := <-res; err != nil {
		t.Fatalf("the call in flight at Close failed: %v", err)
	}
	closeNow(t, inst) // waits for the deferred release
	if left, _ := extractionsIn(e); len(left) != 0 {
		t.Fatalf("temp dir holds %v after the release", left)
	}
}

// TestProcessIsolationSurvivesCrash: a worker that segfaults in process
// isolation fails its call; the host is restarted and the next call served.
func TestProcessIsolationSurvivesCrash(t *testing.T) {
	e := newTestEngine(t, hostConfig(Config{Isolation: IsolationProcess}))
	inst := load(t, e, testSpec, packageOf(t, flagsEcho, nil))
	for i := range 2 {
		_, err := call(t, inst, typed("test.crash", nil))
		if !errors.Is(err, engines.ErrWorkerFailed) || !strings.Contains(err.Error(), "the native host process exited during the call") {
			t.Fatalf("crash #%d: Process = %v", i+1, err)
		}
		if !strings.Contains(err.Error(), "crashing on purpose") {
			t.Errorf("crash #%d: the error does not carry the host's last output: %v", i+1, err)
		} else if i == 0 {
			t.Logf("crash error: %v", err)
		}
		in := enginetest.NewEvent(fmt.Sprintf("after-%d", i), enginetest.TypeRequest, map[string]any{"i": i}, "c")
		if out := mustCall(t, inst, in); len(out) != 1 || out[0].Type() != enginetest.TypeEcho {
			t.Fatalf("after crash #%d: outputs = %v", i+1, out)
		}
	}
}

// TestManifestIsolationOptIn: an in-process engine hosts a worker that asks
// for process isolation in its manifest out of process.
func TestManifestIsolationOptIn(t *testing.T) {
	e := newTestEngine(t, hostConfig(Config{}))
	inst := load(t, e, testSpec, packageOf(t, flagsEcho, map[string]any{"isolation": "process"}))
	if _, ok := inst.(*hostInstance); !ok {
		t.Fatalf("instance is %T, want a host instance", inst)
	}
	if _, err := call(t, inst, typed("test.crash", nil)); !errors.Is(err, engines.ErrWorkerFailed) {
		t.Fatalf("crash: %v", err)
	}
	mustCall(t, inst, typed("test.stats", nil))

	// Without a host binary the worker cannot load.
	_, err := newTestEngine(t, Config{}).Load(context.Background(), testSpec, packageOf(t, flagsEcho, map[string]any{"isolation": "process"}))
	if err == nil || !strings.Contains(err.Error(), "process isolation needs Config.HostPath") {
		t.Fatalf("Load without HostPath = %v", err)
	}
}

func TestRIDs(t *testing.T) {
	for _, c := range []struct{ goos, goarch, rid, file string }{
		{"linux", "amd64", "linux-x64", "libw.so"},
		{"linux", "arm64", "linux-arm64", "libw.so"},
		{"darwin", "arm64", "osx-arm64", "libw.dylib"},
		{"windows", "amd64", "win-x64", "w.dll"},
	} {
		if got := RuntimeID(c.goos, c.goarch); got != c.rid {
			t.Errorf("RuntimeID(%s, %s) = %q, want %q", c.goos, c.goarch, got, c.rid)
		}
		if got := LibraryFileName("w", c.goos); got != c.file {
			t.Errorf("LibraryFileName(w, %s) = %q, want %q", c.goos, got, c.file)
		}
	}
	if got := libraryPath("win-x64", "w"); got != "runtimes/win-x64/native/w.dll" {
		t.Errorf("libraryPath = %q", got)
	}
}

// blockingGateway blocks until its ctx ends.
type blockingGateway struct{ started chan struct{} }

func (g *blockingGateway) Call(ctx context.Context, _, _ string, _ []byte) ([]byte, error) {
	select {
	case g.started <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestGatewayBoundedByDeadline: in process isolation a gateway call ends with
// the event's deadline (the host is killed and restarted).
func TestGatewayBoundedByDeadline(t *testing.T) {
	gw := &blockingGateway{started: make(chan struct{}, 1)}
	e := newTestEngine(t, hostConfig(Config{Isolation: IsolationProcess, Gateway: gw, GatewayTimeout: time.Minute}))
	spec := testSpec
	spec.Timeout = 300 * time.Millisecond
	inst := load(t, e, spec, packageOf(t, flagsEcho, nil))
	start := time.Now()
	_, err := call(t, inst, typed("test.gateway", map[string]any{"q": 1}))
	if !errors.Is(err, engines.ErrTimeout) {
		t.Fatalf("Process = %v, want ErrTimeout", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Process returned after %v", d)
	}
	mustCall(t, inst, typed("test.stats", nil)) // restarted
}

// TestCloseCancelsGatewayCalls: in process, Close cancels the gateway calls
// of the calls in flight, so they can return and Close completes.
func TestCloseCancelsGatewayCalls(t *testing.T) {
	gw := &blockingGateway{started: make(chan struct{}, 1)}
	e := newTestEngine(t, Config{Gateway: gw, GatewayTimeout: time.Minute})
	inst := load(t, e, testSpec, packageOf(t, flagsEcho, nil))
	res := make(chan error, 1)
	go func() { _, err := call(t, inst, typed("test.gateway", map[string]any{"q": 1})); res <- err }()
	select {
	case <-gw.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the gateway was not called")
	}
	start := time.Now()
	closeNow(t, inst)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Close took %v", d)
	}
	if err := <-res; !errors.Is(err, engines.ErrWorkerFailed) || !strings.Contains(err.Error(), "context canceled") {
		t.Fatalf("the call in flight = %v, want the worker's failure after the cancelled gateway call", err)
	}
}

// In process, a timed-out call keeps running (and holds a thread) in
// native code. Past MaxAbandonedCalls such calls the worker's calls fail at
// once with an error that says why, instead of leaking a thread per
// message; once an abandoned call returns, calls work again.
func TestAbandonedNativeCallsAreBounded(t *testing.T) {
	e := newTestEngine(t, Config{MaxAbandonedCalls: 2})
	spec := testSpec
	spec.Timeout = 50 * time.Millisecond
	inst := load(t, e, spec, packageOf(t, flagsEcho, nil))
	for i := range 2 {
		// Far longer than the timeout: a loaded machine may wake the
		// caller late, and the abandoned calls must still be running at
		// the next call.
		if _, err := call(t, inst, typed("test.sleep", 2000)); !errors.Is(err, engines.ErrTimeout) {
			t.Fatalf("hanging call %d: %v, want a timeout", i, err)
		}
	}
	_, err := call(t, inst, typed("test.echo", "x"))
	if !errors.Is(err, engines.ErrWorkerFailed) || !strings.Contains(err.Error(), "2 earlier calls of this worker timed out and are still running in native code") {
		t.Fatalf("call past the limit: %v", err)
	}
	// The abandoned calls return after their 2 s; a machine under heavy
	// load (make test runs the integration stacks meanwhile) may take far
	// longer to schedule them: wait on the outcome, generously.
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := call(t, inst, typed("test.echo", "x"))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("calls still refused a minute after the abandoned ones were due to return: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestConcurrentAbandonedCallsAreBounded is issue 42's item 8: calls that
// arrive together all passed the old check (no call had timed out yet) and
// all hung, so 8 calls were abandoned against a limit of 2. Now every call
// holds one of MaxAbandonedCalls slots while it is in native code (taken
// before it starts): measured in the library, never more than the limit
// run (and hang) at once; the calls that found no slot time out waiting for
// one or are refused, and none of them reaches native code.
func TestConcurrentAbandonedCallsAreBounded(t *testing.T) {
	const limit, callers = 2, 8
	e := newTestEngine(t, Config{MaxAbandonedCalls: limit})
	spec := testSpec
	spec.Timeout = 100 * time.Millisecond
	inst := load(t, e, spec, packageOf(t, flagsEcho, nil))
	in := inst.(*inprocInstance)

	var maxAbandoned atomic.Int32
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() { // the engine's own count, sampled
		defer close(sampled)
		for {
			if n := in.abandoned.Load(); n > maxAbandoned.Load() {
				maxAbandoned.Store(n)
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	start := make(chan struct{})
	errs := make(chan error, callers)
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := call(t, inst, typed("test.sleep", 1500))
			errs <- err
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, engines.ErrTimeout) && !errors.Is(err, engines.ErrWorkerFailed) {
			t.Errorf("a hanging call: %v, want a timeout or a refusal", err)
		}
	}
	// The abandoned calls return after their 1.5 s (generously bounded
	// for a loaded machine); then the library says how many ran at once.
	var got map[string]any
	deadline := time.Now().Add(time.Minute)
	for {
		out, err := call(t, inst, typed("test.sleepstats", nil))
		if err == nil {
			got = enginetest.DataOf(t, out)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("calls still refused a minute after the abandoned ones were due to return: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	<-sampled
	if m := got["max"].(float64); m > limit || m < 1 {
		t.Errorf("%v hanging calls were in native code at once, want 1..%d (MaxAbandonedCalls)", m, limit)
	}
	if n := maxAbandoned.Load(); n > limit {
		t.Errorf("the engine counted %d abandoned calls at once, want at most %d", n, limit)
	}
}

// TestCallsPastTheSlotsWait: calls past MaxAbandonedCalls that are not
// refused wait for a slot (within their deadline) and all succeed, with
// never more than the limit in native code.
func TestCallsPastTheSlotsWait(t *testing.T) {
	const limit, callers = 2, 8
	e := newTestEngine(t, Config{MaxAbandonedCalls: limit})
	spec := testSpec
	spec.Timeout = 20 * time.Second
	inst := load(t, e, spec, packageOf(t, flagsEcho, nil))
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := call(t, inst, typed("test.sleep", 50)); err != nil {
				t.Errorf("a call: %v", err)
			}
		}()
	}
	wg.Wait()
	got := enginetest.DataOf(t, mustCall(t, inst, typed("test.sleepstats", nil)))
	if m := got["max"].(float64); m > limit || m < 1 || got["sleeping"] != 0.0 {
		t.Errorf("sleep stats %v, want at most %d at once and none sleeping now", got, limit)
	}
}
