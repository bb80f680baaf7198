// Package integration drives WorkManager end to end on the real stack: Redis,
// the Temporal dev server and daprd started by internal/devstack on free
// loopback ports, the real worker node and API binaries, real Python. Nothing
// here is mocked.
package integration

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/virtufin/workmanager/internal/daprconn"
	"github.com/virtufin/workmanager/internal/devstack"
	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// env is one test's handle on a running stack: t is the test, stackEnv the
// stack it runs on — its own (newEnv, newEnvWith) or the package's shared
// one (sharedEnv).
type env struct {
	t testing.TB
	*stackEnv
	onShared bool // the package's shared stack (sharedEnv)
}

// stackEnv is one running stack plus node and API processes.
type stackEnv struct {
	dir     string
	stack   *devstack.Stack
	bins    string
	node    *devstack.Proc
	api     *devstack.Proc
	apiAddr string
	nodeURL string
	client  pb.WorkManagerServiceClient
	conn    *grpc.ClientConn
	dapr    *grpc.ClientConn

	mu        sync.Mutex
	lifecycle []lifecycleEvent
	subs      []dispatch.Stream
	apiEnv    []string
	nodeEnv   []string
	// shared is the test's temp root, bound read-write into every worker
	// sandbox (SANDBOX_WRITABLE_PATHS): workerDir makes directories under
	// it that workers may write to.
	shared string
}

type lifecycleEvent struct {
	Type string
	Data lifecycleevents.Data
}

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

func repoRoot() string {
	wd, _ := os.Getwd()
	return filepath.Join(wd, "..", "..")
}

// buildBinaries builds cmd/worker, cmd/api, cmd/native-host, cmd/sandbox-exec and cmd/wmctl
// once per test binary, or uses those in $WM_BIN_DIR (make test builds
// bin/ once for this package and the soak's).
func buildBinaries(t testing.TB) string {
	buildOnce.Do(func() {
		if dir := os.Getenv("WM_BIN_DIR"); dir != "" {
			binDir, buildErr = prebuilt(dir, "worker", "api", "native-host", "sandbox-exec", "wmctl")
			return
		}
		binDir, buildErr = os.MkdirTemp("", "wm-bin-")
		if buildErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", binDir, "./cmd/worker", "./cmd/api", "./cmd/native-host", "./cmd/sandbox-exec", "./cmd/wmctl")
		cmd.Dir = repoRoot()
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// prebuilt checks that dir holds the named binaries.
func prebuilt(dir string, names ...string) (string, error) {
	for _, name := range names {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return "", fmt.Errorf("WM_BIN_DIR=%s: %w (make build makes them)", dir, err)
		}
	}
	return dir, nil
}

// envConfig shapes an env; the zero value is a fresh stack on free ports.
type envConfig struct {
	dir                     string // data dir; reusing one keeps the data
	redisPort, temporalPort int    // fixed ports, as `make run` restarts on its own
	apiEnv, nodeEnv         []string
	resources               map[string]string // extra Dapr resources
	poolSize                int               // daprd's Redis pub/sub pool (0: the manifest's)
	daprdEnv                []string
	daprAPIToken            string // daprd requires it; the test's own calls send it
	// processingTimeout is how long Redis leaves a delivered message to its
	// consumer before redelivering it (0: 6s, short so that tests of
	// redelivery run fast).
	processingTimeout time.Duration
	// ui serves the Temporal Web UI (e.stack.UIURL).
	ui bool
	// keepTemporalData puts Temporal's data in a file in dir, for a test
	// that restarts Temporal on it (otherwise it is kept in memory, which
	// halves the cost of every lifecycle call).
	keepTemporalData bool
	// temporalDynamicConfig are more dynamic config values of the
	// Temporal dev server ("key=JSON value").
	temporalDynamicConfig []string
	// ownTemporal starts a Temporal dev server for this stack alone. Without
	// it (and without ui, keepTemporalData, temporalPort or
	// temporalDynamicConfig, which need one of their own) the stack uses a
	// namespace of its own on the package's shared server (sharedTemporal).
	ownTemporal bool
}

// newEnv starts a full stack in dir (a fresh temp dir when empty).
func newEnv(t testing.TB, dir string) *env {
	t.Helper()
	return newEnvWith(t, envConfig{dir: dir})
}

func newEnvWith(t testing.TB, c envConfig) *env {
	t.Helper()
	if c.dir == "" {
		c.dir = t.TempDir()
	}
	e := &env{t: t, stackEnv: &stackEnv{dir: c.dir, bins: buildBinaries(t), apiEnv: c.apiEnv, nodeEnv: c.nodeEnv, shared: sharedRoot(t)}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var externalTemporal, namespace string
	if !c.ownTemporal && !c.ui && !c.keepTemporalData && c.temporalPort == 0 && len(c.temporalDynamicConfig) == 0 {
		externalTemporal, namespace = sharedTemporal.namespaceFor(t, c.dir)
	}
	st, err := devstack.Start(ctx, devstack.Options{Dir: c.dir, ToolsBin: filepath.Join(repoRoot(), ".tools", "bin"), Headless: !c.ui, TemporalInMemory: !c.keepTemporalData, // not StartT: a test may restart the stack on the same dir
		RedisPort: c.redisPort, TemporalPort: c.temporalPort, RedeliverInterval: time.Second, ProcessingTimeout: cmp.Or(c.processingTimeout, 6*time.Second),
		ExtraResources: c.resources, PoolSize: c.poolSize, DaprdEnv: c.daprdEnv, DaprAPIToken: c.daprAPIToken,
		TemporalDynamicConfig: c.temporalDynamicConfig, ExternalTemporal: externalTemporal, Namespace: namespace})
	if err != nil {
		t.Fatal(err)
	}
	e.stack = st
	t.Cleanup(e.close)
	e.startProcesses()
	return e
}

// sharedTemporal is the package's shared Temporal dev server: a stack that
// does not restart, cut off or configure Temporal uses a namespace of its
// own there instead of starting a server (about 2 CPU-seconds of start-up
// and idle polling per stack, on a machine the suite keeps busy). The
// server creates its namespaces when it starts (with the search
// attributes); a stack restarted on the same dir keeps its namespace.
// Started by the first stack that needs it, stopped by TestMain.
var sharedTemporal = &temporalServer{}

type temporalServer struct {
	once  sync.Once
	stack *devstack.Stack
	err   error
	dir   string
	mu    sync.Mutex
	byDir map[string]string
	next  int
}

// sharedNamespaces is how many namespaces the shared server has: more than
// the package's stacks; a stack beyond them starts its own server.
const sharedNamespaces = 96

func sharedNamespace(i int) string { return fmt.Sprintf("wm-test-%02d", i) }

// namespaceFor returns the shared server's address and dir's namespace
// there, or empty strings when none is left (the stack then starts its
// own server).
func (s *temporalServer) namespaceFor(t testing.TB, dir string) (addr, namespace string) {
	t.Helper()
	s.once.Do(func() {
		s.dir, s.err = os.MkdirTemp("", "wm-shared-temporal-")
		if s.err != nil {
			return
		}
		names := make([]string, sharedNamespaces)
		for i := range names {
			names[i] = sharedNamespace(i + 1)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		s.stack, s.err = devstack.StartTemporal(ctx, devstack.Options{Dir: s.dir, ToolsBin: filepath.Join(repoRoot(), ".tools", "bin"),
			Headless: true, TemporalInMemory: true, TemporalNamespaces: names})
		s.byDir = map[string]string{}
	})
	if s.err != nil {
		t.Fatalf("the shared Temporal dev server: %v", s.err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ns, ok := s.byDir[dir]; ok {
		return s.stack.TemporalAddr, ns
	}
	if s.next >= sharedNamespaces {
		return "", ""
	}
	s.next++
	s.byDir[dir] = sharedNamespace(s.next)
	return s.stack.TemporalAddr, s.byDir[dir]
}

// stop stops the shared server (TestMain, after the tests).
func (s *temporalServer) stop() {
	if s.stack != nil {
		s.stack.Stop()
	}
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
}

// temporalClient is a Temporal client on the stack's server and namespace.
func (e *env) temporalClient(t testing.TB) client.Client {
	t.Helper()
	tc, err := client.Dial(client.Options{HostPort: e.stack.TemporalAddr, Namespace: e.stack.TemporalNamespace()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tc.Close)
	return tc
}

func (e *env) startProcesses() {
	e.t.Helper()
	e.startNode()
	e.startAPI()
	e.connectDapr()
}

// onFreePort runs start on a free loopback port, and again on another one
// when the port was taken between picking it and binding it.
func (e *env) onFreePort(start func(addr string) (*devstack.Proc, error)) (*devstack.Proc, string) {
	e.t.Helper()
	for attempt := 0; ; attempt++ {
		port, err := devstack.FreePort()
		if err != nil {
			e.t.Fatal(err)
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		p, err := start(addr)
		if err == nil {
			return p, addr
		}
		if p != nil {
			p.Kill()
		}
		if attempt < 2 && errors.Is(err, devstack.ErrPortInUse) {
			continue
		}
		e.t.Fatal(err)
	}
}

// withSandbox puts the nodes' worker processes in the strict sandbox
// (make test runs as root with bubblewrap: every layer is there), lets the
// test workers import os and write under e.shared, and gives them the
// node's id and the WM_TEST_REFUSE_LOAD hook through WORKER_ENV. Entries
// in env win over these defaults.
func (e *env) withSandbox(env []string) []string {
	mode := "strict"
	if os.Geteuid() != 0 {
		mode = "standard" // no user ids of their own without root
	}
	out := append([]string{"SANDBOX=" + mode, "PYTHON_ALLOWED_PACKAGES=os", "SANDBOX_WRITABLE_PATHS=" + e.shared}, env...)
	var workerEnv []string
	for _, kv := range out {
		if strings.HasPrefix(kv, "WORKMANAGER_NODE_ID=") || strings.HasPrefix(kv, "WM_TEST_REFUSE_LOAD=") {
			workerEnv = append(workerEnv, kv)
		}
	}
	if len(workerEnv) > 0 {
		out = append(out, "WORKER_ENV="+strings.Join(workerEnv, " "))
	}
	return out
}

// sharedRoot is the directory that holds every t.TempDir() of t, made
// traversable for the sandboxes' user ids.
func sharedRoot(t testing.TB) string {
	root := filepath.Dir(t.TempDir())
	if err := os.Chmod(root, 0o711); err != nil {
		t.Fatal(err)
	}
	return root
}

// workerDir is a fresh directory that sandboxed workers may write to: under
// the test's temp root, or, on the shared stack, under the stack's.
func workerDir(t testing.TB) string {
	if v, ok := sharedTests.Load(t); ok {
		d, err := os.MkdirTemp(v.(*env).shared, "worker-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
		return d
	}
	d := t.TempDir()
	if err := os.Chmod(d, 0o777); err != nil {
		t.Fatal(err)
	}
	return d
}

// startNode starts the worker node and waits for /readyz.
func (e *env) startNode() {
	e.t.Helper()
	var addr string
	e.node, addr = e.onFreePort(func(addr string) (*devstack.Proc, error) {
		p, err := e.stack.StartNode(filepath.Join(e.bins, "worker"), addr,
			e.withSandbox(append([]string{"WORKER_TIMEOUT=2s", "RECONCILE_INTERVAL=5s", "NODE_HEARTBEAT=1s", "LOG_LEVEL=debug", testCodeURLs}, e.nodeEnv...))...)
		if err != nil {
			return nil, err
		}
		return p, devstack.WaitHTTP(context.Background(), p, "http://"+addr+"/readyz", 5*time.Minute)
	})
	e.nodeURL = "http://" + addr
}

// extraNode is one more worker node of a test's stack (startExtraNode):
// same Dapr app id, so it shares the topics' consumer groups with the
// stack's node, on a daprd of its own.
type extraNode struct {
	name    string           // its WORKMANAGER_NODE_ID, and its log's name (name.log; its daprd's: daprd-name.log)
	proc    *devstack.Proc   // the node process
	addr    string           // its HTTP address (health, /readyz, /metrics)
	sidecar devstack.Sidecar // its daprd (GRPCAddr, HTTPAddr)
}

// url is the node's HTTP base URL.
func (n *extraNode) url() string { return "http://" + n.addr }

// startExtraNode starts one more node named name (its node id) on a daprd
// of its own, with the settings of the stack's node (startNode, e.nodeEnv)
// and extraEnv after them, its NODE_STATE_DIR in the stack's folder, and
// waits for its /readyz. The node is killed and its daprd stopped when t
// ends (their log tails printed if t failed). Use it on a stack of the
// test's own (newEnv, newEnvWith), not the shared one: the node joins the
// cluster.
func (e *env) startExtraNode(t testing.TB, name string, extraEnv ...string) *extraNode {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sc, err := e.stack.StartSidecar(ctx, "daprd-"+name)
	if err != nil {
		t.Fatalf("start the daprd of node %s: %v", name, err)
	}
	n := &extraNode{name: name, sidecar: sc}
	t.Cleanup(func() {
		n.proc.Kill()
		sc.Proc.Stop(5 * time.Second)
		if t.Failed() {
			for _, l := range []string{name, "daprd-" + name} {
				t.Logf("---- %s.log (tail) ----\n%s", l, tailOf(filepath.Join(e.dir, l+".log")))
			}
		}
	})
	for attempt := 0; ; attempt++ { // as onFreePort: again on another port if this one was taken meanwhile
		port, err := devstack.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		env := append([]string{"WORKER_TIMEOUT=2s", "RECONCILE_INTERVAL=5s", "NODE_HEARTBEAT=1s", "LOG_LEVEL=debug", testCodeURLs}, e.nodeEnv...)
		env = append(append(env, "DAPR_GRPC_ADDRESS="+sc.GRPCAddr, "WORKMANAGER_HTTP_ADDR="+addr, "WORKMANAGER_NODE_ID="+name,
			"NODE_STATE_DIR="+filepath.Join(e.dir, name+"-state")), extraEnv...)
		p, err := devstack.StartProc(e.dir, name, e.withSandbox(append(e.stack.Env(), env...)), filepath.Join(e.bins, "worker"))
		if err != nil {
			t.Fatalf("start node %s: %v", name, err)
		}
		n.proc, n.addr = p, addr
		err = devstack.WaitHTTP(ctx, p, n.url()+"/readyz", 5*time.Minute)
		if err == nil {
			return n
		}
		p.Kill()
		if attempt < 2 && errors.Is(err, devstack.ErrPortInUse) {
			continue
		}
		t.Fatalf("node %s not ready: %v", name, err)
	}
}

// tailOf is the end of the file at path (for a failed test's log).
func tailOf(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 6000 {
		b = b[len(b)-6000:]
	}
	return string(b)
}

// testCodeURLs lets the tests serve URL code sources from loopback
// httptest servers; every other SSRF rule stays on (TestCodeURLSources).
const testCodeURLs = "CODE_URL_TEST_ALLOW_LOOPBACK=true"

func (e *env) startAPI() {
	e.t.Helper()
	e.api, e.apiAddr = e.onFreePort(func(addr string) (*devstack.Proc, error) {
		p, err := e.stack.StartAPI(filepath.Join(e.bins, "api"), addr, append([]string{"LOG_LEVEL=debug", "API_RATE_LIMIT=1000", "API_RATE_BURST=1000", testCodeURLs}, e.apiEnv...)...)
		if err != nil {
			return nil, err
		}
		token, _, err := devstack.DevToken(e.stack.Dir)
		if err != nil {
			return p, err
		}
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithPerRPCCredentials(devstack.Bearer(token)))
		if err != nil {
			return p, err
		}
		client := pb.NewWorkManagerServiceClient(conn)
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) && !p.Exited() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err = client.ListWorkers(ctx, &pb.ListWorkersRequest{})
			cancel()
			if err == nil {
				if e.conn != nil {
					e.conn.Close()
				}
				e.conn, e.client = conn, client
				return p, nil
			}
			time.Sleep(100 * time.Millisecond)
		}
		conn.Close()
		return p, fmt.Errorf("api not serving: %v\n%s", err, p.Tail())
	})
}

// connectDapr opens the test's own client to daprd and subscribes to the
// lifecycle topic.
func (e *env) connectDapr() {
	e.t.Helper()
	var err error
	e.dapr, err = daprconn.Dial(e.stack.DaprGRPCAddr, daprconn.Options{Token: e.stack.DaprAPIToken})
	if err != nil {
		e.t.Fatal(err)
	}
	ch := e.subscribe(lifecycleevents.Topic)
	go func() {
		for ev := range ch {
			var d lifecycleevents.Data
			_ = ev.DataAs(&d)
			e.mu.Lock()
			e.lifecycle = append(e.lifecycle, lifecycleEvent{Type: ev.Type(), Data: d})
			e.mu.Unlock()
		}
	}()
}

// subscribe opens a real streaming subscription on daprd and returns the
// events received (each acked SUCCESS).
func (e *env) subscribe(topic string) <-chan event.Event {
	e.t.Helper()
	ch, _ := e.subscribeClosable(topic)
	return ch
}

// subscribeClosable is subscribe, and a function that ends the
// subscription before the test does.
func (e *env) subscribeClosable(topic string) (<-chan event.Event, func()) {
	e.t.Helper()
	sub := dispatch.DaprSubscriber{Client: runtimev1.NewDaprClient(e.dapr)}
	st, err := sub.Subscribe(context.Background(), devstack.PubSubName, topic)
	if err != nil {
		e.t.Fatal(err)
	}
	e.mu.Lock()
	e.subs = append(e.subs, st)
	e.mu.Unlock()
	ch := make(chan event.Event, 100)
	go func() {
		defer close(ch)
		for {
			req, err := st.Recv()
			if err != nil {
				return
			}
			var ev event.Event
			if err := dispatch.Decode(req, &ev); err == nil {
				ch <- ev
			}
			_ = st.Ack(req.GetId(), dispatch.AckSuccess)
		}
	}()
	// Subscribe returned after daprd confirmed the subscription, so its
	// consumer group exists: anything published from now on is received.
	return ch, st.Close
}

// publish sends a structured CloudEvent through daprd's HTTP API.
func (e *env) publish(topic, id string, data any, correlationID string) {
	e.t.Helper()
	ce := map[string]any{"id": id, "type": "test.input", "datacontenttype": "application/json", "data": data}
	if correlationID != "" {
		ce["correlationid"] = correlationID
	}
	e.publishEvent(topic, ce)
}

// firstOutputID is the id the node gives the first output of worker for
// the input inputID published by publish (source "integration-test"):
// internal/dispatch's default, <input id>/<worker id>/<index>/<source tag>.
func firstOutputID(inputID, worker string) string {
	sum := sha256.Sum256([]byte("integration-test"))
	return inputID + "/" + worker + "/0/" + hex.EncodeToString(sum[:4])
}

// publishEvent publishes ce (specversion and source defaulted) as a
// structured CloudEvent, which keeps its id, type and extensions.
func (e *env) publishEvent(topic string, ce map[string]any) {
	e.t.Helper()
	ce["specversion"] = "1.0"
	if ce["source"] == nil {
		ce["source"] = "integration-test"
	}
	body, _ := json.Marshal(ce)
	url := fmt.Sprintf("http://%s/v1.0/publish/%s/%s", e.stack.DaprHTTPAddr, devstack.PubSubName, topic)
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/cloudevents+json")
	if tok := e.stack.DaprAPIToken; tok != "" {
		req.Header.Set(daprconn.TokenHeader, tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		e.t.Fatalf("publish to %s: HTTP %d", topic, resp.StatusCode)
	}
}

// httpGet fetches a path from the node's HTTP endpoint.
func (e *env) httpGet(t testing.TB, path string) string {
	t.Helper()
	resp, err := http.Get(e.nodeURL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// killNode SIGKILLs the node process.
func (e *env) killNode() { e.node.Kill() }

// waitLifecycle waits for a lifecycle event of kind for workerID.
func (e *env) waitLifecycle(workerID string, kind lifecycleevents.Kind, timeout time.Duration) lifecycleEvent {
	e.t.Helper()
	return e.waitLifecycleFor(workerID, kind, "", timeout)
}

// waitLifecycleFor waits for a lifecycle event of the worker of that kind
// about one input event (eventID; any when empty): a worker.error of an
// earlier input's retry can arrive after the test moved on to the next one.
func (e *env) waitLifecycleFor(workerID string, kind lifecycleevents.Kind, eventID string, timeout time.Duration) lifecycleEvent {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		e.mu.Lock()
		for _, ev := range e.lifecycle {
			if ev.Data.WorkerID == workerID && ev.Type == lifecycleevents.TypePrefix+string(kind) && (eventID == "" || ev.Data.EventID == eventID) {
				e.mu.Unlock()
				return ev
			}
		}
		e.mu.Unlock()
		time.Sleep(50 * time.Millisecond)
	}
	e.t.Fatalf("no %s lifecycle event for worker %s (input %q) within %s (got %v)", kind, workerID, eventID, timeout, e.lifecycleFor(workerID))
	return lifecycleEvent{}
}

func (e *env) lifecycleFor(workerID string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, ev := range e.lifecycle {
		if ev.Data.WorkerID == workerID {
			out = append(out, ev.Type)
		}
	}
	return out
}

func (e *env) closeSubs() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range e.subs {
		s.Close()
	}
	e.subs = nil
}

// stopAll stops node, API and the stack, keeping the data directory.
func (e *env) stopAll() {
	e.closeSubs()
	if e.dapr != nil {
		e.dapr.Close()
		e.dapr = nil
	}
	if e.conn != nil {
		e.conn.Close()
		e.conn = nil
	}
	e.api.Stop(5 * time.Second)
	e.node.Stop(10 * time.Second)
	e.stack.Stop()
}

func (e *env) close() {
	if e.t.Failed() {
		e.logTails(e.t)
	}
	e.stopAll()
	if e.t.Failed() {
		e.keepLogs(e.t)
	}
}

// keepLogs copies every process log of a failed test's stack (and its
// workers' files) into $WM_FAILED_LOGS/<test name>, which make test sets
// to .run/test/failed: the tails printed above are often not enough.
func (e *env) keepLogs(t testing.TB) {
	root := os.Getenv("WM_FAILED_LOGS")
	if root == "" {
		return
	}
	dst := filepath.Join(root, strings.ReplaceAll(t.Name(), "/", "_"))
	_ = filepath.WalkDir(e.dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".log") {
			return nil
		}
		rel, _ := filepath.Rel(e.dir, path)
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		if os.MkdirAll(filepath.Dir(filepath.Join(dst, rel)), 0o755) == nil {
			_ = os.WriteFile(filepath.Join(dst, rel), b, 0o644)
		}
		return nil
	})
	t.Logf("the stack's full logs: %s", dst)
}

// logTails prints the end of each process log of the stack to t.
func (e *env) logTails(t testing.TB) {
	for _, p := range []string{"node", "node-b", "api", "daprd", "daprd-b", "temporal"} {
		b, _ := os.ReadFile(filepath.Join(e.dir, p+".log"))
		if len(b) > 6000 {
			b = b[len(b)-6000:]
		}
		t.Logf("---- %s.log (tail) ----\n%s", p, b)
	}
}

// expectEvent waits for one event on ch.
func expectEvent(t testing.TB, ch <-chan event.Event, timeout time.Duration) event.Event {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("subscription closed")
		}
		return ev
	case <-time.After(timeout):
		t.Fatalf("no event within %s", timeout)
	}
	return event.Event{}
}

// waitUnsubscribed waits until the daprd at httpAddr holds no subscription
// to topic: from then on nothing behind that daprd can receive the topic's
// messages. This proves a worker idle without waiting for something not to
// happen.
func (e *env) waitUnsubscribed(t testing.TB, httpAddr, topic string) {
	t.Helper()
	waitFor(t, 30*time.Second, "no subscription to "+topic+" on daprd "+httpAddr, func() bool {
		subscribed, err := daprSubscribed(httpAddr, e.stack.DaprAPIToken, topic)
		return err == nil && !subscribed
	})
}

// daprSubscribed asks daprd's metadata API (at httpAddr, sending token when
// set) whether its app subscribes to topic.
func daprSubscribed(httpAddr, token, topic string) (bool, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+httpAddr+"/v1.0/metadata", nil)
	if err != nil {
		return false, err
	}
	if token != "" {
		req.Header.Set(daprconn.TokenHeader, token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	var md struct {
		Subscriptions []struct {
			Topic string `json:"topic"`
		} `json:"subscriptions"`
	}
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("daprd metadata: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&md); err != nil {
		return false, err
	}
	for _, s := range md.Subscriptions {
		if s.Topic == topic {
			return true, nil
		}
	}
	return false, nil
}

// redisCLI runs redis-cli against the stack's Redis and returns its output.
func (e *env) redisCLI(t testing.TB, args ...string) string {
	t.Helper()
	port := e.stack.RedisAddr[strings.LastIndex(e.stack.RedisAddr, ":")+1:]
	out, err := exec.Command("redis-cli", append([]string{"-h", "127.0.0.1", "-p", port}, args...)...).Output()
	if err != nil {
		t.Fatalf("redis-cli %v: %v", args, err)
	}
	return string(out)
}
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// logHistories prints, when t has failed, the event history of every run
// of workflow id from runID on (following continue-as-new): each event's
// time, type and, for a workflow task, its task queue's kind and any
// timeout — where a stalled lifecycle call waited.
func logHistories(t testing.TB, tc client.Client, id, runID string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for run := 0; runID != "" && run < 50; run++ {
			var b strings.Builder
			next := ""
			it := tc.GetWorkflowHistory(ctx, id, runID, false, 0)
			for it.HasNext() {
				ev, err := it.Next()
				if err != nil {
					fmt.Fprintf(&b, "  (history: %v)\n", err)
					break
				}
				fmt.Fprintf(&b, "  %3d %s %s", ev.GetEventId(), ev.GetEventTime().AsTime().Format("15:04:05.000"), ev.GetEventType())
				if a := ev.GetWorkflowTaskScheduledEventAttributes(); a != nil {
					fmt.Fprintf(&b, " queue=%s kind=%s", a.GetTaskQueue().GetName(), a.GetTaskQueue().GetKind())
				}
				if a := ev.GetWorkflowTaskTimedOutEventAttributes(); a != nil {
					fmt.Fprintf(&b, " timeout=%s", a.GetTimeoutType())
				}
				if a := ev.GetWorkflowTaskFailedEventAttributes(); a != nil {
					fmt.Fprintf(&b, " cause=%s %s", a.GetCause(), a.GetFailure().GetMessage())
				}
				if a := ev.GetWorkflowExecutionUpdateAcceptedEventAttributes(); a != nil {
					fmt.Fprintf(&b, " update=%s %s", a.GetAcceptedRequest().GetInput().GetName(), a.GetProtocolInstanceId())
				}
				if a := ev.GetWorkflowExecutionContinuedAsNewEventAttributes(); a != nil {
					next = a.GetNewExecutionRunId()
				}
				b.WriteByte('\n')
			}
			t.Logf("history of %s run %s:\n%s", id, runID, b.String())
			runID = next
		}
	})
}
