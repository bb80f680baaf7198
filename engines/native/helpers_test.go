//go:build linux || darwin || freebsd

package native

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/native/host"
)

// hostEnv makes the test binary act as cmd/native-host (host.Main, see
// TestMain).
const hostEnv = "NATIVE_ENGINE_TEST_AS_HOST"

var fixtureDir string

func TestMain(m *testing.M) {
	if os.Getenv(hostEnv) == "1" {
		os.Exit(host.Main(os.Args[1:]))
	}
	dir, err := os.MkdirTemp("", "native-engine-fixtures-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fixtureDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// libs caches compiled fixture libraries by their gcc flags.
var libs sync.Map // string -> *compiled

type compiled struct {
	once sync.Once
	path string
	err  error
}

// compileFixture compiles testdata/fixture.c with flags into a shared
// library (once per flags) and returns its path.
func compileFixture(flags ...string) (string, error) {
	key := strings.Join(flags, " ")
	v, _ := libs.LoadOrStore(key, &compiled{})
	c := v.(*compiled)
	c.once.Do(func() {
		gcc, err := exec.LookPath("gcc")
		if err != nil {
			c.err = errNoGCC
			return
		}
		dir, err := os.MkdirTemp(fixtureDir, "lib-*")
		if err != nil {
			c.err = err
			return
		}
		c.path = filepath.Join(dir, "libfixture.so")
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		args := append([]string{"-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-I../../sdk/native", "-o", c.path}, flags...)
		args = append(args, "testdata/fixture.c")
		if out, err := exec.CommandContext(ctx, gcc, args...).CombinedOutput(); err != nil {
			c.err = fmt.Errorf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	})
	return c.path, c.err
}

var errNoGCC = errors.New("gcc is not on PATH: the native engine tests compile their fixtures with it")

// fixtureLib is compileFixture for a test: it skips without gcc.
func fixtureLib(t testing.TB, flags ...string) string {
	t.Helper()
	p, err := compileFixture(flags...)
	if errors.Is(err, errNoGCC) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// compileAll compiles several variants in parallel (gcc is the slow part).
func compileAll(t testing.TB, variants ...[]string) {
	t.Helper()
	var wg sync.WaitGroup
	for _, v := range variants {
		wg.Add(1)
		go func() {
			defer wg.Done()
			compileFixture(v...)
		}()
	}
	wg.Wait()
	for _, v := range variants {
		fixtureLib(t, v...)
	}
}

// entry is one file of a test zip.
type entry struct {
	name string
	data []byte
}

func zipOf(t testing.TB, entries ...entry) []byte {
	t.Helper()
	return buildZip(t, entries, nil)
}

// buildZip writes entries as regular files and link, if any, as a symbolic
// link whose target is its data.
func buildZip(t testing.TB, entries []entry, link *entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	add := func(e entry, h *zip.FileHeader) {
		w, err := zw.CreateHeader(h)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(e.data); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range entries {
		method := zip.Deflate
		if len(e.data) == 0 {
			// Nothing to compress: Store spares a flate writer per entry
			// (4,098 of them cost 12 s under the race detector).
			method = zip.Store
		}
		add(e, &zip.FileHeader{Name: e.name, Method: method})
	}
	if link != nil {
		h := &zip.FileHeader{Name: link.name, Method: zip.Store}
		h.SetMode(fs.ModeSymlink | 0o777)
		add(*link, h)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// manifestJSON returns a manifest for library "fixture" plus extra fields.
func manifestJSON(extra map[string]any) []byte {
	m := map[string]any{"abi_version": 1, "library": "fixture"}
	for k, v := range extra {
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	b, _ := json.Marshal(m)
	return b
}

// packageOf zips a compiled fixture with a manifest for this platform.
func packageOf(t testing.TB, flags []string, extra map[string]any) []byte {
	t.Helper()
	lib := readFile(t, fixtureLib(t, flags...))
	return zipOf(t,
		entry{ManifestName, manifestJSON(extra)},
		entry{libraryPath(hostRID, "fixture"), lib},
	)
}

var (
	flagsEcho   = []string{}
	flagsMulti  = []string{"-DMODE_MULTI"}
	flagsNone   = []string{"-DMODE_NONE"}
	flagsRaise  = []string{"-DMODE_RAISE"}
	flagsHang   = []string{"-DMODE_HANG"}
	flagsNoFree = []string{"-DNO_FREE"}
)

func conformanceFixtures(t *testing.T) enginetest.Fixtures {
	t.Helper()
	compileAll(t, flagsEcho, flagsMulti, flagsNone, flagsRaise, flagsHang, flagsNoFree)
	return enginetest.Fixtures{
		Echo:    packageOf(t, flagsEcho, nil),
		Multi:   packageOf(t, flagsMulti, nil),
		None:    packageOf(t, flagsNone, nil),
		Raise:   packageOf(t, flagsRaise, nil),
		Hang:    packageOf(t, flagsHang, nil),
		Invalid: packageOf(t, flagsNoFree, nil),
	}
}

// hostConfig runs the test binary itself as the native host.
func hostConfig(cfg Config) Config {
	cfg.HostPath = os.Args[0]
	cfg.HostEnv = append(cfg.HostEnv, hostEnv+"=1")
	return cfg
}

func newTestEngine(t testing.TB, cfg Config) *Engine {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.TempDir == "" {
		cfg.TempDir = t.TempDir()
	}
	return New(cfg)
}

var testSpec = engines.Spec{WorkerID: "w-native", MIMEType: MIMEType, Topic: "topic-native", Group: "group-native"}

// load loads code and closes the instance at the end of the test.
func load(t testing.TB, e *Engine, spec engines.Spec, code []byte) engines.Instance {
	t.Helper()
	return enginetest.Load(t, e, spec, code)
}

func call(t testing.TB, inst engines.Instance, ev *event.Event) ([]event.Event, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return inst.Process(ctx, ev)
}

func mustCall(t testing.TB, inst engines.Instance, ev *event.Event) []event.Event {
	t.Helper()
	out, err := call(t, inst, ev)
	if err != nil {
		t.Fatalf("Process(%s): %v", ev.Type(), err)
	}
	return out
}

func typed(typ string, data any) *event.Event {
	return enginetest.NewEvent("id-"+typ, typ, data, "")
}

// recorder is a slog.Handler that keeps "level|worker_id|message" of the
// records it gets.
type recorder struct {
	attrs []slog.Attr
	*recorded
}

type recorded struct {
	mu      sync.Mutex
	records []string
}

func newRecorder() *recorder { return &recorder{recorded: &recorded{}} }

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	attrs := map[string]string{}
	for _, a := range r.attrs {
		attrs[a.Key] = a.Value.String()
	}
	rec.Attrs(func(a slog.Attr) bool {
		attrs[a.Key] = a.Value.String()
		return true
	})
	r.mu.Lock()
	r.records = append(r.records, fmt.Sprintf("%s|%s|%s", rec.Level, attrs["worker_id"], rec.Message))
	r.mu.Unlock()
	return nil
}
func (r *recorder) WithAttrs(a []slog.Attr) slog.Handler {
	return &recorder{attrs: append(append([]slog.Attr(nil), r.attrs...), a...), recorded: r.recorded}
}
func (r *recorder) WithGroup(string) slog.Handler { return r }

func (r *recorder) lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.records...)
}

// zipWithSymlink is zipOf plus a symbolic link entry.
func zipWithSymlink(t testing.TB, entries ...entry) []byte {
	t.Helper()
	return buildZip(t, entries, &entry{"runtimes/" + hostRID + "/native/link.so", []byte("../../../../etc/passwd")})
}

// zipWithLyingSize is zipOf plus an entry "big.bin" whose header declares
// size bytes.
func zipWithLyingSize(t testing.TB, m, lib entry, size uint64) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, e := range []entry{m, lib} {
		w, _ := zw.Create(e.name)
		w.Write(e.data)
	}
	data := []byte("abc")
	w, err := zw.CreateRaw(&zip.FileHeader{Name: "big.bin", Method: zip.Store, CRC32: crc32.ChecksumIEEE(data),
		CompressedSize64: uint64(len(data)), UncompressedSize64: size})
	if err != nil {
		t.Fatal(err)
	}
	w.Write(data)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
