package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/virtufin/workmanager/internal/devstack"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Node settings of the soak. Short timeouts keep the bounds of the checker
// small; GROUP_LOCK_MAX_AGE_MS is what a SIGSTOP must outlast.
const (
	workerTimeout     = 5 * time.Second
	processingTimeout = 15 * time.Second
	lockMaxAge        = 6 * time.Second
	maxAttempts       = 3
	nodeHeartbeat     = time.Second // NODE_HEARTBEAT: a node silent for 3 counts as gone
)

func nodeSettings() []string {
	return []string{
		"WORKER_TIMEOUT=" + workerTimeout.String(),
		"RECONCILE_INTERVAL=5s", "NODE_HEARTBEAT=" + nodeHeartbeat.String(), "LOG_LEVEL=info",
		"WORKER_MAX_ATTEMPTS=" + strconv.Itoa(maxAttempts), "WORKER_RETRY_BACKOFF=200ms",
		"GROUP_LOCK_MAX_AGE_MS=" + strconv.Itoa(int(lockMaxAge/time.Millisecond)),
		"GROUP_LOCK_RETRY_BASE_DELAY_MS=20", "GROUP_LOCK_MAX_RETRIES=10",
		"WORKER_QUEUE_DEPTH=64", "SHUTDOWN_GRACE=5s",
		"DEBUG_PPROF=1", // heap profiles before and after the run (nodeFigures)
		// Issue 45: each topic served by placementReplicas of the nodes,
		// placement planned every PLACEMENT_INTERVAL (the defaults, said
		// here so that the checker's expectation is the nodes' setting).
		"PLACEMENT_REPLICAS=" + strconv.Itoa(placementReplicas), "PLACEMENT_INTERVAL=" + placementInterval.String(),
	}
}

// cluster is the stack of one soak: Redis, Temporal, the checker's and
// publisher's daprd (the stack's own), N nodes each with its own daprd,
// and the API.
type cluster struct {
	t     *testing.T
	dir   string
	bins  string
	tools string
	stack *devstack.Stack

	// keepLogs keeps the stack's logs also when the test passes (a slow
	// lifecycle call's history is among them).
	keepLogs bool

	// extraEnv is added to every node's environment.
	extraEnv []string

	mu    sync.Mutex
	nodes []*node
	// joined holds the nodes node-join started and has not stopped yet
	// (not in nodes: the fault schedule's targets and the leak figures
	// are the nodes of the whole run).
	joined   []*node
	temporal *devstack.Proc // our own after the first Temporal restart
	extra    []*devstack.Proc

	// pauseNodeOnly: sigstop-node stops the node process alone, not its
	// worker processes (CHAOS_PAUSE=node-only): a grouped call in flight
	// then finishes meanwhile and its reply waits for the node, as in
	// TestStaleLockHolderOutputIsRefused — what a stale write needs.
	pauseNodeOnly bool

	api     *devstack.Proc
	apiAddr string
	conn    *grpc.ClientConn
	client  pb.WorkManagerServiceClient
}

// node is one WorkManager node process with its own daprd.
type node struct {
	id       string
	httpAddr string
	env      []string
	daprd    *devstack.Proc
	proc     *devstack.Proc
	// redis and temporal are the node's own ways to Redis (its daprd's
	// components point at it) and to Temporal (its TEMPORAL_ADDRESS): the
	// nemesis cuts them to cut the node off.
	redis, temporal *proxy
	stopped         bool // SIGSTOPped
	down            bool // killed, not yet restarted
	daprDown        bool
}

func repoRoot() string {
	wd, _ := os.Getwd()
	return filepath.Join(wd, "..", "..")
}

// buildBinaries builds the node and the API into a temp dir, or uses
// those in $WM_BIN_DIR (make test builds bin/ once for the integration
// tests and the soak).
func buildBinaries(t *testing.T) string {
	if dir := os.Getenv("WM_BIN_DIR"); dir != "" {
		for _, name := range []string{"worker", "api", "native-host", "sandbox-exec"} {
			if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
				t.Fatalf("WM_BIN_DIR=%s: %v (make build makes them)", dir, err)
			}
		}
		return dir
	}
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", dir, "./cmd/worker", "./cmd/api", "./cmd/native-host", "./cmd/sandbox-exec")
	cmd.Dir = repoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return dir
}

// sandboxEnv mirrors the integration harness: the strict sandbox as root,
// os importable (the workers read their node id), the node id passed to the
// worker processes.
func sandboxEnv(nodeID string) []string {
	mode := "strict"
	if os.Geteuid() != 0 {
		mode = "standard"
	}
	return []string{"SANDBOX=" + mode, "PYTHON_ALLOWED_PACKAGES=os", "WORKMANAGER_NODE_ID=" + nodeID,
		"WORKER_ENV=WORKMANAGER_NODE_ID=" + nodeID}
}

// startCluster starts the stack, nodes nodes (with extraEnv added to each
// node's environment) and the API.
func startCluster(t *testing.T, nodes int, extraEnv ...string) *cluster {
	t.Helper()
	c := &cluster{t: t, dir: t.TempDir(), tools: filepath.Join(repoRoot(), ".tools", "bin")}
	for _, b := range []string{"temporal", "daprd"} {
		if _, err := os.Stat(filepath.Join(c.tools, b)); err != nil {
			t.Fatalf("%s missing in %s: run make tools (make chaos does)", b, c.tools)
		}
	}
	c.bins = buildBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	st, err := devstack.Start(ctx, devstack.Options{Dir: c.dir, ToolsBin: c.tools, Headless: true,
		RedeliverInterval: time.Second, ProcessingTimeout: processingTimeout})
	if err != nil {
		t.Fatal(err)
	}
	c.stack = st
	c.extraEnv = extraEnv
	t.Cleanup(c.close)
	for i := 1; i <= nodes; i++ {
		n, err := c.newNode(ctx, "n"+strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, n)
		if err := c.startNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	c.startAPI(ctx)
	return c
}

// newNode prepares node id: its ways to Redis and Temporal, its daprd
// (started) and its environment; startNode starts the node itself.
func (c *cluster) newNode(ctx context.Context, id string) (*node, error) {
	n := &node{id: id}
	var err error
	if n.redis, err = newProxy(c.stack.RedisAddr); err != nil {
		return nil, fmt.Errorf("node %s's Redis proxy: %w", id, err)
	}
	if n.temporal, err = newProxy(c.stack.TemporalAddr); err != nil {
		n.redis.close()
		return nil, fmt.Errorf("node %s's Temporal proxy: %w", id, err)
	}
	grpcAddr, err := c.startNodeDaprd(ctx, n)
	if err != nil {
		n.redis.close()
		n.temporal.close()
		return nil, fmt.Errorf("node %s's daprd: %w", id, err)
	}
	port, err := devstack.FreePort()
	if err != nil {
		n.daprd.Stop(5 * time.Second)
		n.redis.close()
		n.temporal.close()
		return nil, fmt.Errorf("node %s's HTTP port: %w", id, err)
	}
	n.httpAddr = "127.0.0.1:" + strconv.Itoa(port)
	n.env = append(append(append(append(c.stack.Env(), "DAPR_GRPC_ADDRESS="+grpcAddr, "WORKMANAGER_HTTP_ADDR="+n.httpAddr,
		"TEMPORAL_ADDRESS="+n.temporal.addr()), nodeSettings()...), sandboxEnv(n.id)...), c.extraEnv...)
	return n, nil
}

// startNodeDaprd starts node n's daprd on free ports, its pub/sub and
// state store pointed at n's Redis proxy (resources in dapr-<node id>),
// and returns its gRPC address. A restart reuses its arguments.
func (c *cluster) startNodeDaprd(ctx context.Context, n *node) (string, error) {
	res := filepath.Join(c.dir, "dapr-"+n.id)
	if err := devstack.WriteComponents(res, n.redis.addr(), time.Second, processingTimeout, 0); err != nil {
		return "", err
	}
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var ports [4]int
		for i := range ports {
			if ports[i], err = devstack.FreePort(); err != nil {
				return "", err
			}
		}
		args := []string{"--app-id", devstack.AppID, "--dapr-grpc-port", strconv.Itoa(ports[0]), "--dapr-http-port", strconv.Itoa(ports[1]),
			"--dapr-internal-grpc-port", strconv.Itoa(ports[2]), "--metrics-port", strconv.Itoa(ports[3]),
			"--dapr-listen-addresses", "127.0.0.1", "--resources-path", res, "--log-level", "warn"}
		var p *devstack.Proc
		p, err = devstack.StartProc(c.dir, "daprd-"+n.id, nil, filepath.Join(c.tools, "daprd"), args...)
		if err != nil {
			return "", err
		}
		err = waitDaprd(ctx, p, "http://127.0.0.1:"+strconv.Itoa(ports[1])+"/v1.0/healthz/outbound")
		if err == nil {
			c.mu.Lock()
			n.daprd = p
			c.mu.Unlock()
			return "127.0.0.1:" + strconv.Itoa(ports[0]), nil
		}
		p.Kill()
		if !errors.Is(err, devstack.ErrPortInUse) {
			break
		}
	}
	return "", err
}

func (c *cluster) startNode(ctx context.Context, n *node) error {
	p, err := devstack.StartProc(c.dir, "node-"+n.id, n.env, filepath.Join(c.bins, "worker"))
	if err != nil {
		return err
	}
	c.mu.Lock()
	n.proc = p
	c.mu.Unlock()
	return devstack.WaitHTTP(ctx, p, "http://"+n.httpAddr+"/readyz", 3*time.Minute)
}

func (c *cluster) startAPI(ctx context.Context) {
	t := c.t
	for attempt := 0; ; attempt++ {
		port, err := devstack.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		p, err := c.stack.StartAPI(filepath.Join(c.bins, "api"), addr, "LOG_LEVEL=info", "API_RATE_LIMIT=1000", "API_RATE_BURST=1000")
		if err != nil {
			t.Fatal(err)
		}
		err = devstack.WaitTCP(ctx, p, addr, time.Minute)
		if err != nil {
			p.Kill()
			if attempt < 2 && errors.Is(err, devstack.ErrPortInUse) {
				continue
			}
			t.Fatal(err)
		}
		token, _, err := devstack.DevToken(c.stack.Dir)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithPerRPCCredentials(devstack.Bearer(token)))
		if err != nil {
			t.Fatal(err)
		}
		c.api, c.apiAddr, c.conn, c.client = p, addr, conn, pb.NewWorkManagerServiceClient(conn)
		deadline := time.Now().Add(time.Minute)
		for {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err = c.client.ListWorkers(cctx, &pb.ListWorkersRequest{})
			cancel()
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("api not serving: %v\n%s", err, p.Tail())
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// restartProc starts p's command again (same binary, arguments and
// environment, so the same ports), logging to the same file.
func (c *cluster) restartProc(ctx context.Context, p *devstack.Proc, name string) (*devstack.Proc, error) {
	args := p.Cmd.Args[1:]
	np, err := devstack.StartProc(c.dir, name, p.Cmd.Env[len(os.Environ()):], p.Cmd.Path, args...)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.extra = append(c.extra, np)
	c.mu.Unlock()
	return np, nil
}

// restartDaprd kills node n's daprd (SIGKILL) and starts it again on the
// same ports after down.
func (c *cluster) restartDaprd(ctx context.Context, n *node, down time.Duration) error {
	c.mu.Lock()
	old := n.daprd
	n.daprDown = true
	c.mu.Unlock()
	old.Kill()
	sleepCtx(ctx, down)
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		var np *devstack.Proc
		np, err = c.restartProc(ctx, old, "daprd-"+n.id)
		if err != nil {
			return err
		}
		httpPort := argAfter(old.Cmd.Args, "--dapr-http-port")
		err = waitDaprd(ctx, np, "http://127.0.0.1:"+httpPort+"/v1.0/healthz/outbound")
		if err == nil {
			c.mu.Lock()
			n.daprd, n.daprDown = np, false
			c.mu.Unlock()
			return nil
		}
		np.Kill()
		if !errors.Is(err, devstack.ErrPortInUse) {
			break
		}
		sleepCtx(ctx, time.Second)
	}
	return err
}

// killNode sends SIGKILL to node n's process group and restarts it after
// down; its note says what placement did with n's topics meanwhile
// (watchKilled).
func (c *cluster) killNode(ctx context.Context, n *node, topics []string, down time.Duration) (note string, err error) {
	c.mu.Lock()
	p := n.proc
	n.down = true
	c.mu.Unlock()
	p.Kill()
	note = c.watchKilled(ctx, n.id, topics, down)
	for attempt := 0; attempt < 5; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		err = c.startNode(rctx, n)
		cancel()
		if err == nil {
			c.mu.Lock()
			n.down = false
			c.mu.Unlock()
			return note, nil
		}
		c.mu.Lock()
		n.proc.Kill()
		c.mu.Unlock()
		if !errors.Is(err, devstack.ErrPortInUse) {
			break
		}
		sleepCtx(ctx, time.Second)
	}
	return note, err
}

// pauseNode SIGSTOPs node n's process group for d, then SIGCONTs it.
func (c *cluster) pauseNode(ctx context.Context, n *node, d time.Duration) {
	thaw := c.freeze(n, c.pauseNodeOnly)
	defer thaw()
	sleepCtx(ctx, d)
}

// freeze SIGSTOPs node n and returns what SIGCONTs it. The worker
// processes run in sandboxes with process groups of their own: freeze
// stops the node's group and every descendant, as a paused host; with
// nodeOnly it stops the node process alone (a grouped call in flight then
// finishes meanwhile and its reply waits for the node).
func (c *cluster) freeze(n *node, nodeOnly bool) (thaw func()) {
	c.mu.Lock()
	pid := n.proc.Cmd.Process.Pid
	n.stopped = true
	c.mu.Unlock()
	var desc []int
	if nodeOnly {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	} else {
		_ = syscall.Kill(-pid, syscall.SIGSTOP)
		desc = descendants(pid)
		for _, d := range desc {
			_ = syscall.Kill(d, syscall.SIGSTOP)
		}
	}
	return func() {
		for _, d := range desc {
			_ = syscall.Kill(d, syscall.SIGCONT)
		}
		if nodeOnly {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		} else {
			_ = syscall.Kill(-pid, syscall.SIGCONT)
		}
		c.mu.Lock()
		n.stopped = false
		c.mu.Unlock()
	}
}

// restartRedis shuts Redis down (its append-only file kept) and starts it
// again on the same port after down.
func (c *cluster) restartRedis(ctx context.Context, down time.Duration) error {
	c.stack.StopRedis()
	sleepCtx(ctx, down)
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		if err = c.stack.StartRedis(ctx); err == nil || !errors.Is(err, devstack.ErrPortInUse) {
			return err
		}
		sleepCtx(ctx, time.Second)
	}
	return err
}

// temporalProc finds the running Temporal dev server of this stack.
func (c *cluster) temporalPID() (int, []string, error) {
	c.mu.Lock()
	own := c.temporal
	c.mu.Unlock()
	if own != nil {
		return own.Cmd.Process.Pid, own.Cmd.Args, nil
	}
	db := filepath.Join(c.dir, "temporal", "temporal.db")
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, nil, err
	}
	for _, d := range ents {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if len(args) > 2 && args[1] == "server" && strings.Contains(string(raw), db) {
			return pid, args, nil
		}
	}
	return 0, nil, errors.New("temporal dev server process not found")
}

// restartTemporal stops the Temporal dev server (SIGTERM, SIGKILL after
// 10 s), keeps its database and starts it again on the same port after
// down.
func (c *cluster) restartTemporal(ctx context.Context, down time.Duration) error {
	pid, args, err := c.temporalPID()
	if err != nil {
		return err
	}
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
		if st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); strings.Contains(string(st), ") Z ") {
			break // a zombie: exited, not yet reaped
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	c.mu.Lock()
	if c.temporal != nil {
		c.temporal.Kill()
	}
	c.mu.Unlock()
	sleepCtx(ctx, down)
	for attempt := 0; attempt < 5; attempt++ {
		p, err2 := devstack.StartProc(c.dir, "temporal", nil, filepath.Join(c.tools, "temporal"), args[1:]...)
		if err2 != nil {
			return err2
		}
		c.mu.Lock()
		c.temporal = p
		c.mu.Unlock()
		err = c.waitTemporal(ctx, p)
		if err == nil {
			return nil
		}
		p.Kill()
		if !strings.Contains(p.Output(), "address already in use") {
			break
		}
		sleepCtx(ctx, 2*time.Second)
	}
	return err
}

func (c *cluster) waitTemporal(ctx context.Context, p *devstack.Proc) error {
	deadline := time.Now().Add(90 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		if p.Exited() {
			return fmt.Errorf("temporal exited: %s", p.Tail())
		}
		out, err := exec.CommandContext(ctx, filepath.Join(c.tools, "temporal"), "operator", "cluster", "health",
			"--address", c.stack.TemporalAddr, "--command-timeout", "2s").CombinedOutput()
		if err == nil {
			return nil
		}
		last = fmt.Errorf("%v: %s", err, out)
		sleepCtx(ctx, 300*time.Millisecond)
	}
	return fmt.Errorf("temporal not healthy after restart: %v", last)
}

// health reads node n's /health report status.
func (n *node) health() string {
	cl := http.Client{Timeout: 3 * time.Second}
	resp, err := cl.Get("http://" + n.httpAddr + "/health")
	if err != nil {
		return "unreachable: " + err.Error()
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
	}
	if err := decodeJSON(resp.Body, &r); err != nil {
		return "undecodable: " + err.Error()
	}
	return r.Status
}

// keepDir makes the directory a run's logs are kept in.
func keepDir(test string) (string, error) {
	if base := os.Getenv("WM_FAILED_LOGS"); base != "" {
		dir := filepath.Join(base, test)
		return dir, os.MkdirAll(dir, 0o755)
	}
	return os.MkdirTemp("", "chaos-logs-")
}

func (c *cluster) close() {
	if c.t.Failed() || c.keepLogs || os.Getenv("CHAOS_KEEP_LOGS") != "" {
		// The stack's logs outlive the test's temp dir: in
		// $WM_FAILED_LOGS/<test> under make test, else in /tmp.
		keep, err := keepDir(c.t.Name())
		if err == nil {
			logs, _ := filepath.Glob(filepath.Join(c.dir, "*.log"))
			profiles, _ := filepath.Glob(filepath.Join(c.dir, "*.pb.gz"))
			goroutines, _ := filepath.Glob(filepath.Join(c.dir, "goroutines-*.txt"))
			logs = append(append(logs, profiles...), goroutines...)
			for _, l := range logs {
				if b, err := os.ReadFile(l); err == nil {
					_ = os.WriteFile(filepath.Join(keep, filepath.Base(l)), b, 0o644)
				}
			}
			c.t.Logf("logs of the stack kept in %s", keep)
		}
	}
	if c.conn != nil {
		c.conn.Close()
	}
	c.mu.Lock()
	var procs []*devstack.Proc
	var proxies []*proxy
	for _, n := range append(slices.Clone(c.nodes), c.joined...) {
		if n.proc != nil {
			_ = syscall.Kill(-n.proc.Cmd.Process.Pid, syscall.SIGCONT)
			procs = append(procs, n.proc)
		}
		if n.daprd != nil {
			procs = append(procs, n.daprd)
		}
		proxies = append(proxies, n.redis, n.temporal)
	}
	procs = append(procs, c.extra...)
	if c.temporal != nil {
		procs = append(procs, c.temporal)
	}
	c.mu.Unlock()
	if c.api != nil {
		c.api.Stop(5 * time.Second)
	}
	for _, p := range procs {
		p.Stop(5 * time.Second)
	}
	c.stack.Stop()
	for _, p := range proxies {
		if p != nil {
			p.close()
		}
	}
}

func argAfter(args []string, flag string) string {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// waitDaprd waits until a restarted daprd answers its health check with a
// 2xx (it answers 204), exits, or a minute passes.
func waitDaprd(ctx context.Context, p *devstack.Proc, url string) error {
	cl := http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(time.Minute)
	var last error
	for time.Now().Before(deadline) {
		if p.Exited() {
			err := fmt.Errorf("daprd exited during start-up:\n%s", p.Tail())
			if strings.Contains(p.Output(), "address already in use") {
				err = fmt.Errorf("%w: %w", devstack.ErrPortInUse, err)
			}
			return err
		}
		resp, err := cl.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				return nil
			}
			err = fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		last = err
		sleepCtx(ctx, 200*time.Millisecond)
	}
	return fmt.Errorf("daprd not ready after a minute: %v", last)
}

// descendants lists the processes below pid (children, grandchildren, …).
func descendants(pid int) []int {
	parent := map[int]int{}
	ents, _ := os.ReadDir("/proc")
	for _, d := range ents {
		p, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil {
			continue
		}
		st := string(raw)
		f := strings.Fields(st[strings.LastIndexByte(st, ')')+2:])
		if len(f) > 1 {
			pp, _ := strconv.Atoi(f[1])
			parent[p] = pp
		}
	}
	var out []int
	for p := range parent {
		for q := parent[p]; q > 1; q = parent[q] {
			if q == pid {
				out = append(out, p)
				break
			}
		}
	}
	return out
}
