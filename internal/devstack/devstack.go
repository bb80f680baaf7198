// Package devstack starts the real servers WorkManager runs on — Redis, the
// Temporal dev server (with its Web UI) and daprd — as child processes on
// loopback, for `make run` and for the integration tests. Every process gets
// its own log file, is started in its own process group and is killed by
// Stop. Nothing is assumed to be running already.
package devstack

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.temporal.io/api/operatorservice/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/virtufin/workmanager/deploy/dapr/components"
	"github.com/virtufin/workmanager/internal/temporalconn"
)

// Search attributes registered in the Temporal dev server so the Web UI and
// `temporal workflow list --query` can filter workers: the worker
// workflows' (internal/temporalconn), as NAME=Keyword.
var SearchAttributes = func() []string {
	var out []string
	for _, name := range temporalconn.SearchAttributes {
		out = append(out, name+"=Keyword")
	}
	return out
}()

// AppID is the Dapr app id of WorkManager nodes.
const AppID = "workmanager"

// Component names written into the Dapr resources folder.
const (
	PubSubName = "pubsub"
	StateName  = "statestore"
)

// Options choose where the stack lives and which ports it uses. A zero port
// means a free loopback port.
type Options struct {
	// Dir holds data, logs and Dapr resources. Reusing a Dir keeps Redis and
	// Temporal data across restarts.
	Dir string
	// ToolsBin holds the temporal and daprd binaries.
	ToolsBin string
	// Ports; zero means "pick a free one".
	RedisPort, TemporalPort, UIPort, DaprGRPCPort, DaprHTTPPort int
	// Headless drops the Temporal Web UI.
	Headless bool
	// TemporalInMemory keeps the Temporal dev server's data in memory: a
	// lifecycle call costs about half the time and CPU of one on the file
	// database (which writes and syncs every workflow step), but the data
	// is gone when the server stops. For stacks that are never restarted
	// (tests); without it the database is a file in Dir, in WAL mode.
	TemporalInMemory bool
	// RedeliverInterval and ProcessingTimeout tune Redis stream redelivery
	// (zero: the manifest's, deploy/dapr/components/pubsub.yaml).
	RedeliverInterval, ProcessingTimeout time.Duration
	// DaprAPIToken, when set, makes daprd require it on every API call
	// (DAPR_API_TOKEN) and is passed to the node and API processes.
	DaprAPIToken string
	// PoolSize is daprd's Redis pub/sub connection pool (zero: the
	// manifest's). It must exceed the topics one node subscribes to.
	PoolSize int
	// DaprdEnv is added to daprd's environment (for example
	// DAPRD_UPSTREAM_REDIS_PUBSUB=1 for a side-by-side measurement).
	DaprdEnv []string
	// ExtraResources are more Dapr resource files (name → YAML), e.g. an
	// HTTPEndpoint that workers reach through the gateway.
	ExtraResources map[string]string
	// TemporalDynamicConfig are more of the dev server's dynamic config
	// values, each "key=JSON value" (temporal server start-dev
	// --dynamic-config-value), e.g. matching.longPollExpirationInterval="10s".
	TemporalDynamicConfig []string
	// TemporalNamespaces are created, with the search attributes, when the
	// dev server creates its database (besides "default").
	TemporalNamespaces []string
	// ExternalTemporal is the host:port of a Temporal server the stack uses
	// instead of starting one (Start leaves it alone, Stop too); Namespace
	// is the namespace its processes use there. Tests share one dev server
	// this way, a namespace each (StartTemporal).
	ExternalTemporal string
	// Namespace is the Temporal namespace of the stack's processes
	// (TEMPORAL_NAMESPACE; empty: "default").
	Namespace string
}

// Stack is a running set of servers.
type Stack struct {
	Options
	RedisAddr    string
	TemporalAddr string
	UIURL        string
	DaprGRPCAddr string
	DaprHTTPAddr string
	procs        []*Proc
	daprd        *Proc
	redis        *Proc
}

// Proc is one child process.
type Proc struct {
	Name string
	Cmd  *exec.Cmd
	Log  string
	// logStart is where this run's output starts in Log (logs are appended
	// across restarts).
	logStart int64
	done     chan struct{}
	err      error
}

// ErrPortInUse marks a start-up that failed because a port was taken.
var ErrPortInUse = errors.New("address already in use")

// FreePort returns a free loopback TCP port. Like the Temporal dev server's
// own picker, it leaves the port in TIME_WAIT (a connection closed from the
// server side), so the kernel does not hand it out again as an ephemeral
// port — to the Temporal server's internal services or to any outgoing
// connection — for a minute, while servers (which set SO_REUSEADDR) can still
// bind it.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	c, err := net.DialTimeout("tcp", l.Addr().String(), time.Second)
	if err != nil {
		return 0, fmt.Errorf("reserve port %d: %w", port, err)
	}
	defer c.Close()
	_ = l.(*net.TCPListener).SetDeadline(time.Now().Add(time.Second))
	sc, err := l.Accept()
	if err != nil {
		return 0, fmt.Errorf("reserve port %d: %w", port, err)
	}
	sc.Close() // server side first: TIME_WAIT stays on this port
	return port, nil
}

func pick(p *int) error {
	if *p != 0 {
		return nil
	}
	var err error
	*p, err = FreePort()
	return err
}

// StartProc starts a child process in its own process group, logging to
// dir/name.log.
func StartProc(dir, name string, env []string, bin string, args ...string) (*Proc, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	start, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		f.Close()
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{Name: name, Cmd: cmd, Log: logPath, logStart: start, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// Done is closed when the process has ended.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Kill sends SIGKILL to the process group and waits for the process.
func (p *Proc) Kill() {
	if p == nil || p.Cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM, then SIGKILL after grace.
func (p *Proc) Stop(grace time.Duration) {
	if p == nil || p.Cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.Kill()
	}
}

// Terminate sends SIGTERM to the process alone (not its children, as an
// orchestrator stopping a container's main process does) and waits up to
// limit for it to exit, then kills the group.
func (p *Proc) Terminate(limit time.Duration) {
	if p == nil || p.Cmd.Process == nil {
		return
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(limit):
		p.Kill()
	}
}

// Output returns what this run of the process has logged so far.
func (p *Proc) Output() string {
	b, _ := os.ReadFile(p.Log)
	if p.logStart <= int64(len(b)) {
		b = b[p.logStart:]
	}
	return string(b)
}

// Tail returns the end of this run's log for error messages, preceded by the
// first panic line when the end is a long stack trace that no longer shows it.
func (p *Proc) Tail() string {
	out := p.Output()
	if len(out) <= 3000 {
		return out
	}
	tail := out[len(out)-3000:]
	if i := strings.Index(out, "panic: "); i >= 0 && i < len(out)-3000 {
		line, _, _ := strings.Cut(out[i:], "\n")
		return line + "\n...\n" + tail
	}
	return tail
}

// Start brings up Redis, Temporal and daprd and waits until each answers.
func Start(ctx context.Context, o Options) (*Stack, error) {
	for _, d := range []string{"redis", "temporal", "dapr"} {
		if err := os.MkdirAll(filepath.Join(o.Dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	s := &Stack{Options: o}
	ok := false
	defer func() {
		if !ok {
			s.Stop()
		}
	}()
	if err := s.withFreePorts(ctx, s.startRedis, &s.RedisPort); err != nil {
		return nil, err
	}
	if o.ExternalTemporal == "" {
		if err := s.withFreePorts(ctx, s.startTemporal, &s.TemporalPort, &s.UIPort); err != nil {
			return nil, err
		}
	}
	if err := s.withFreePorts(ctx, s.StartDaprd, &s.DaprGRPCPort, &s.DaprHTTPPort); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

// withFreePorts runs start, picking the ports the caller left at zero. A
// port picked free can be taken by another process before the server binds
// it; then the server fails with "address already in use" (ErrPortInUse) and start is tried
// again with new ports (up to three times).
func (s *Stack) withFreePorts(ctx context.Context, start func(context.Context) error, ports ...*int) error {
	fixed := make([]bool, len(ports))
	for i, p := range ports {
		fixed[i] = *p != 0
	}
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		for i, p := range ports {
			if !fixed[i] {
				*p = 0
				if err := pick(p); err != nil {
					return err
				}
			}
		}
		s.setAddrs()
		if err = start(ctx); err == nil || !errors.Is(err, ErrPortInUse) {
			return err
		}
	}
	return err
}

// StartTemporal starts only a Temporal dev server (o's Dir, ToolsBin,
// ports, Headless, TemporalInMemory, TemporalDynamicConfig and
// TemporalNamespaces count): a server several stacks share through
// Options.ExternalTemporal, a namespace each. Stop stops it.
func StartTemporal(ctx context.Context, o Options) (*Stack, error) {
	if err := os.MkdirAll(filepath.Join(o.Dir, "temporal"), 0o755); err != nil {
		return nil, err
	}
	s := &Stack{Options: o}
	s.ExternalTemporal = ""
	if err := s.withFreePorts(ctx, s.startTemporal, &s.TemporalPort, &s.UIPort); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

func (s *Stack) setAddrs() {
	s.RedisAddr = fmt.Sprintf("127.0.0.1:%d", s.RedisPort)
	s.TemporalAddr = fmt.Sprintf("127.0.0.1:%d", s.TemporalPort)
	if s.ExternalTemporal != "" {
		s.TemporalAddr = s.ExternalTemporal
	}
	s.DaprGRPCAddr = fmt.Sprintf("127.0.0.1:%d", s.DaprGRPCPort)
	s.DaprHTTPAddr = fmt.Sprintf("127.0.0.1:%d", s.DaprHTTPPort)
	s.UIURL = ""
	if !s.Headless {
		s.UIURL = fmt.Sprintf("http://127.0.0.1:%d", s.UIPort)
	}
}

func (s *Stack) startRedis(ctx context.Context) error {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return errors.New("redis-server not found: install Debian's redis-server (make deps does it)")
	}
	p, err := StartProc(s.Dir, "redis", nil, bin,
		"--bind", "127.0.0.1", "--port", strconv.Itoa(s.RedisPort), "--dir", filepath.Join(s.Dir, "redis"),
		"--appendonly", "yes", "--save", "", "--protected-mode", "no", "--daemonize", "no")
	if err != nil {
		return err
	}
	s.procs = append(s.procs, p)
	s.redis = p
	return waitFor(ctx, p, 20*time.Second, func() error {
		c, err := net.DialTimeout("tcp", s.RedisAddr, time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Second))
		if _, err := c.Write([]byte("PING\r\n")); err != nil {
			return err
		}
		buf := make([]byte, 16)
		n, err := c.Read(buf)
		if err != nil || !strings.HasPrefix(string(buf[:n]), "+PONG") {
			return fmt.Errorf("redis not ready: %q %v", buf[:n], err)
		}
		return nil
	})
}

func (s *Stack) startTemporal(ctx context.Context) error {
	httpPort, err := FreePort()
	if err != nil {
		return err
	}
	metricsPort, err := FreePort()
	if err != nil {
		return err
	}
	args := []string{"server", "start-dev", "--ip", "127.0.0.1", "--port", strconv.Itoa(s.TemporalPort),
		"--log-level", "warn",
		"--http-port", strconv.Itoa(httpPort), "--metrics-port", strconv.Itoa(metricsPort),
		// Several updates may be in flight on one worker workflow.
		"--dynamic-config-value", "history.maxInFlightUpdates=100",
		// The dev server has one history shard, whose transfer queue is
		// read at most 20 times a second by default: each activity task
		// costs two reads, so lifecycle calls made back to back waited
		// ~50 ms per read (stop 400 ms instead of 70). A cluster of many
		// shards spreads this; see docs/operating.md.
		"--dynamic-config-value", "history.transferProcessorMaxPollRPS=1000",
		// An activity a workflow task schedules on its own task queue
		// (Apply) goes back to the worker with the task's answer instead
		// of through matching (eager activity execution; the SDK asks
		// for it, the server's default refuses).
		"--dynamic-config-value", "system.enableActivityEagerExecution=true",
		// One partition a task queue: the server's default of four
		// spreads a queue's tasks over partitions that a worker's few
		// polls do not all cover, and a task in an uncovered one waited
		// for a poll up to 2 s (a burst of creates; docs/performance.md,
		// "Less work a create"). A cluster with many workers' polls needs
		// no such change.
		"--dynamic-config-value", "matching.numTaskqueueReadPartitions=1",
		"--dynamic-config-value", "matching.numTaskqueueWritePartitions=1",
	}
	for _, kv := range s.TemporalDynamicConfig {
		args = append(args, "--dynamic-config-value", kv)
	}
	if !s.TemporalInMemory {
		// WAL with synchronous=NORMAL: a write is in the log (the OS's page
		// cache) when the server answers, so a killed server loses nothing;
		// the disk is synced at checkpoints, not at every workflow step.
		args = append(args, "--db-filename", filepath.Join(s.Dir, "temporal", "temporal.db"),
			"--sqlite-pragma", "journal_mode=wal", "--sqlite-pragma", "synchronous=normal")
	}
	if s.Headless {
		args = append(args, "--headless")
	} else {
		args = append(args, "--ui-port", strconv.Itoa(s.UIPort))
	}
	for _, sa := range SearchAttributes {
		args = append(args, "--search-attribute", sa)
	}
	for _, ns := range s.TemporalNamespaces {
		args = append(args, "--namespace", ns)
	}
	p, err := StartProc(s.Dir, "temporal", nil, filepath.Join(s.ToolsBin, "temporal"), args...)
	if err != nil {
		return err
	}
	s.procs = append(s.procs, p)
	// Reconnects at most 250 ms apart: gRPC's default backoff grows to
	// minutes, so a server that came up after a few failed dials would be
	// seen seconds late.
	conn, err := grpc.NewClient(s.TemporalAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, MaxDelay: 250 * time.Millisecond},
			MinConnectTimeout: 2 * time.Second,
		}))
	if err != nil {
		return fmt.Errorf("temporal dev server at %s: %w", s.TemporalAddr, err)
	}
	defer conn.Close()
	// Asked in-process over gRPC, as `temporal operator cluster health`
	// does: the CLI (a 250 MB binary) cost about 0.2 CPU-seconds per
	// poll, and a start-up on a busy machine polls dozens of times.
	health := healthpb.NewHealthClient(conn)
	if err := waitFor(ctx, p, 60*time.Second, func() error {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		resp, err := health.Check(cctx, &healthpb.HealthCheckRequest{Service: temporalHealthService})
		if err != nil {
			return err
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("frontend %s", resp.GetStatus())
		}
		return nil
	}); err != nil {
		return err
	}
	return s.ensureSearchAttributes(ctx, operatorservice.NewOperatorServiceClient(conn))
}

// temporalHealthService is the gRPC health service name of Temporal's
// frontend.
const temporalHealthService = "temporal.api.workflowservice.v1.WorkflowService"

// ensureSearchAttributes registers the search attributes a database made
// by an older version lacks: --search-attribute takes effect only when
// the dev server creates its database.
func (s *Stack) ensureSearchAttributes(ctx context.Context, op operatorservice.OperatorServiceClient) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return temporalconn.EnsureSearchAttributes(cctx, op, "default")
}

// StartDaprd (re)starts daprd with Redis pub/sub and state components.
func (s *Stack) StartDaprd(ctx context.Context) error {
	p, err := s.startDaprd(ctx, "daprd", s.DaprGRPCPort, s.DaprHTTPPort)
	if p != nil {
		s.daprd = p
	}
	return err
}

// Sidecar is an extra daprd of the same app id on the same Redis, for a
// second node.
type Sidecar struct {
	GRPCAddr, HTTPAddr string
	Proc               *Proc
}

// StartSidecar starts another daprd (logging to name.log) on free ports.
func (s *Stack) StartSidecar(ctx context.Context, name string) (Sidecar, error) {
	var sc Sidecar
	grpcPort, httpPort := 0, 0
	err := s.withFreePorts(ctx, func(ctx context.Context) error {
		p, err := s.startDaprd(ctx, name, grpcPort, httpPort)
		sc = Sidecar{GRPCAddr: fmt.Sprintf("127.0.0.1:%d", grpcPort), HTTPAddr: fmt.Sprintf("127.0.0.1:%d", httpPort), Proc: p}
		return err
	}, &grpcPort, &httpPort)
	return sc, err
}

// StartAppSidecar starts a daprd for another Dapr application: app id
// appID, whose HTTP server listens on 127.0.0.1:appPort, so that the
// stack's daprd reaches it by service invocation (tests: a backend behind
// the gateway).
func (s *Stack) StartAppSidecar(ctx context.Context, name, appID string, appPort int) (Sidecar, error) {
	var sc Sidecar
	grpcPort, httpPort := 0, 0
	err := s.withFreePorts(ctx, func(ctx context.Context) error {
		p, err := s.startDaprdAs(ctx, name, appID, appPort, grpcPort, httpPort)
		sc = Sidecar{GRPCAddr: fmt.Sprintf("127.0.0.1:%d", grpcPort), HTTPAddr: fmt.Sprintf("127.0.0.1:%d", httpPort), Proc: p}
		return err
	}, &grpcPort, &httpPort)
	return sc, err
}

func (s *Stack) startDaprd(ctx context.Context, name string, grpcPort, httpPort int) (*Proc, error) {
	return s.startDaprdAs(ctx, name, AppID, 0, grpcPort, httpPort)
}

func (s *Stack) startDaprdAs(ctx context.Context, name, appID string, appPort, grpcPort, httpPort int) (*Proc, error) {
	res := filepath.Join(s.Dir, "dapr")
	if err := WriteComponents(res, s.RedisAddr, s.RedeliverInterval, s.ProcessingTimeout, s.PoolSize); err != nil {
		return nil, err
	}
	for name, yaml := range s.ExtraResources {
		if err := os.WriteFile(filepath.Join(res, name), []byte(yaml), 0o644); err != nil {
			return nil, err
		}
	}
	metrics, err := FreePort()
	if err != nil {
		return nil, err
	}
	internal, err := FreePort()
	if err != nil {
		return nil, err
	}
	env := s.DaprdEnv
	if s.DaprAPIToken != "" {
		env = append(append([]string(nil), env...), "DAPR_API_TOKEN="+s.DaprAPIToken)
	}
	args := []string{"--app-id", appID, "--dapr-grpc-port", strconv.Itoa(grpcPort), "--dapr-http-port", strconv.Itoa(httpPort),
		"--dapr-internal-grpc-port", strconv.Itoa(internal), "--metrics-port", strconv.Itoa(metrics),
		"--dapr-listen-addresses", "127.0.0.1", "--resources-path", res, "--log-level", "warn",
		// As deploy/k8s (dapr.io/max-body-size) and the node's default
		// DAPR_MAX_BODY_BYTES: daprd's own default is 4 MiB.
		"--max-body-size", "16Mi"}
	if appPort != 0 {
		args = append(args, "--app-port", strconv.Itoa(appPort), "--app-protocol", "http")
	}
	p, err := StartProc(s.Dir, name, env, filepath.Join(s.ToolsBin, "daprd"), args...)
	if err != nil {
		return nil, err
	}
	s.procs = append(s.procs, p)
	return p, waitFor(ctx, p, 60*time.Second, func() error {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/v1.0/healthz/outbound", httpPort))
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("daprd health %d", resp.StatusCode)
		}
		return nil
	})
}

// HTTPEndpoint is a Dapr HTTPEndpoint resource named name for baseURL: Dapr
// service invocation of name reaches baseURL/<method>.
func HTTPEndpoint(name, baseURL string) string {
	return fmt.Sprintf("apiVersion: dapr.io/v1alpha1\nkind: HTTPEndpoint\nmetadata:\n  name: %s\nspec:\n  baseUrl: %s\n", name, baseURL)
}

// StopRedis shuts Redis down cleanly (its data is saved), to test a broker
// outage; StartRedis brings it back on the same port with the same data.
func (s *Stack) StopRedis() { s.redis.Stop(10 * time.Second) }

// StartRedis restarts Redis after StopRedis.
func (s *Stack) StartRedis(ctx context.Context) error { return s.startRedis(ctx) }

// DaprdPID is the process id of the stack's daprd (for CPU accounting in
// benchmarks).
func (s *Stack) DaprdPID() int { return s.daprd.Cmd.Process.Pid }

// RedisPID is the process id of the stack's Redis.
func (s *Stack) RedisPID() int { return s.redis.Cmd.Process.Pid }

// KillDaprd kills daprd (to test reconnection).
func (s *Stack) KillDaprd() { s.daprd.Kill() }

// WriteComponents writes the pub/sub and state store components: the
// manifests of deploy/dapr/components, pointed at redisAddr. Zero durations
// and pool size keep the manifest's values.
func WriteComponents(dir, redisAddr string, redeliver, processing time.Duration, poolSize int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	pubsubSet := map[string]string{"redisHost": redisAddr}
	if redeliver > 0 {
		pubsubSet["redeliverInterval"] = redeliver.String()
	}
	if processing > 0 {
		pubsubSet["processingTimeout"] = processing.String()
	}
	if poolSize > 0 {
		pubsubSet["poolSize"] = strconv.Itoa(poolSize)
	}
	for file, set := range map[string]map[string]string{
		components.PubSub:     pubsubSet,
		components.StateStore: {"redisHost": redisAddr},
	} {
		b, err := components.Render(file, set)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, file), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Stop kills every process of the stack, daprd first.
func (s *Stack) Stop() {
	for i := len(s.procs) - 1; i >= 0; i-- {
		s.procs[i].Stop(5 * time.Second)
	}
	s.procs = nil
}

// waitFor polls check until it succeeds, the process exits, or limit passes.
func waitFor(ctx context.Context, p *Proc, limit time.Duration, check func() error) error {
	deadline := time.Now().Add(limit)
	var last error
	for time.Now().Before(deadline) {
		if p.Exited() {
			err := fmt.Errorf("%s exited during start-up: %v\n%s", p.Name, p.err, p.Tail())
			if strings.Contains(p.Output(), "address already in use") {
				err = fmt.Errorf("%w: %w", ErrPortInUse, err)
			}
			return err
		}
		if last = check(); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s not ready after %s: %v\n%s", p.Name, limit, last, p.Tail())
}

// TemporalNamespace is the namespace the stack's processes use.
func (s *Stack) TemporalNamespace() string {
	if s.Namespace == "" {
		return "default"
	}
	return s.Namespace
}

// Env is the environment that points a node or the API at this stack.
func (s *Stack) Env() []string {
	env := []string{
		"TEMPORAL_ADDRESS=" + s.TemporalAddr,
		"TEMPORAL_NAMESPACE=" + s.TemporalNamespace(),
		"DAPR_GRPC_ADDRESS=" + s.DaprGRPCAddr,
		"DAPR_PUBSUB=" + PubSubName,
		"DAPR_STATESTORE=" + StateName,
		// The stack's redis-server runs with appendonly yes and
		// noeviction (Redis' default): the health check says so.
		"REDIS_CHECK_ADDR=" + s.RedisAddr,
	}
	if s.DaprAPIToken != "" {
		env = append(env, "DAPR_API_TOKEN="+s.DaprAPIToken)
	}
	return env
}

// StartNode starts a WorkManager node binary serving HTTP on httpAddr.
func (s *Stack) StartNode(bin, httpAddr string, env ...string) (*Proc, error) {
	// Its crash journal in the stack's folder (kept across restarts of the
	// node), unless env says where.
	return s.startNodeAs(bin, "node", httpAddr, s.NodeStateDir(), env...)
}

// startNodeAs starts a node logging to name.log with its local files in
// stateDir; env comes last (a later value of a variable wins).
func (s *Stack) startNodeAs(bin, name, httpAddr, stateDir string, env ...string) (*Proc, error) {
	base := append(s.Env(), "WORKMANAGER_HTTP_ADDR="+httpAddr, "NODE_STATE_DIR="+stateDir)
	return StartProc(s.Dir, name, append(base, env...), bin)
}

// NodeStateDir is where StartNode's node keeps its local files (its crash
// journal, NODE_STATE_DIR): <Dir>/node-state.
func (s *Stack) NodeStateDir() string {
	return filepath.Join(s.Dir, "node-state")
}

// StartAPI starts the WorkManager API binary listening on addr.
//
// Authentication is on: unless env configures it (API_TOKENS_FILE,
// API_AUTH, ...), the API accepts the stack's dev token (DevToken), an
// admin of the default tenant.
func (s *Stack) StartAPI(bin, addr string, env ...string) (*Proc, error) {
	base := append(s.Env(), "WORKMANAGER_API_ADDR="+addr)
	if !hasAuthSetting(env) {
		_, file, err := DevToken(s.Dir)
		if err != nil {
			return nil, err
		}
		base = append(base, "API_TOKENS_FILE="+file)
	}
	return StartProc(s.Dir, "api", append(base, env...), bin)
}

func hasAuthSetting(env []string) bool {
	for _, kv := range env {
		// JWTs and client certificates go with tokens: the dev token stays.
		if strings.HasPrefix(kv, "API_TOKENS_FILE=") || strings.HasPrefix(kv, "API_AUTH=") {
			return true
		}
	}
	return false
}

const devTokenComment = "# written by devstack: the dev token of "

// DevToken returns the dev bearer token of the stack in dir and its
// tokens file, making them on first use: dir/dev-token holds the token
// (mode 0600; `make run` prints how to send it), dir/api-tokens its
// SHA-256 as an admin of the default tenant (subject "dev"), after any
// lines the user added there (e.g. tokens of other tenants). Later calls,
// and restarts on the same dir, keep the token.
func DevToken(dir string) (token, tokensFile string, err error) {
	tokenFile, tokensFile := filepath.Join(dir, "dev-token"), filepath.Join(dir, "api-tokens")
	if b, err := os.ReadFile(tokenFile); err == nil && len(strings.TrimSpace(string(b))) >= 32 {
		token = strings.TrimSpace(string(b))
	} else {
		raw := make([]byte, 32)
		if _, err := rand.Read(raw); err != nil {
			return "", "", err
		}
		token = "wm_dev_" + hex.EncodeToString(raw)
		if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
			return "", "", err
		}
	}
	sum := sha256.Sum256([]byte(token))
	// Lines the user added (more tokens, other tenants) are kept; the dev
	// line is replaced.
	var kept []string
	old, err := os.ReadFile(tokensFile)
	if err == nil {
		for _, l := range strings.Split(strings.TrimRight(string(old), "\n"), "\n") {
			if l != "" && !strings.HasPrefix(l, devTokenComment) && !strings.HasSuffix(l, " admin default dev") {
				kept = append(kept, l)
			}
		}
	}
	kept = append(kept, devTokenComment+tokenFile+" (an admin of the default tenant)", "sha256:"+hex.EncodeToString(sum[:])+" admin default dev")
	content := []byte(strings.Join(kept, "\n") + "\n")
	if bytes.Equal(old, content) {
		return token, tokensFile, nil
	}
	// Replaced whole (a file beside it, renamed over it), never truncated
	// in place: an API starting meanwhile reads the old file or the new
	// one, never an empty one ("lists no token": a CI run's second stack
	// on one directory).
	tmp := tokensFile + ".tmp"
	if err := os.WriteFile(tmp, content, 0o600); err != nil {
		return "", "", err
	}
	if err := os.Rename(tmp, tokensFile); err != nil {
		return "", "", err
	}
	return token, tokensFile, nil
}

// WaitTCP waits until addr accepts connections, the process exits, or
// limit passes.
func WaitTCP(ctx context.Context, p *Proc, addr string, limit time.Duration) error {
	return waitFor(ctx, p, limit, func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// WaitHTTP polls url until it answers 200, the process exits, or limit passes.
func WaitHTTP(ctx context.Context, p *Proc, url string, limit time.Duration) error {
	return waitFor(ctx, p, limit, func() error {
		resp, err := http.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: HTTP %d", url, resp.StatusCode)
		}
		return nil
	})
}

// Bearer is gRPC per-call credentials that send a bearer token, also
// without TLS (the dev stack is on loopback).
type Bearer string

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (b Bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials.
func (Bearer) RequireTransportSecurity() bool { return false }

// NodeEnv is what `make run`'s node gets on top of the stack's
// environment (getenv is os.Getenv): a fixed node id (after a crash the
// restarted node takes over its own task queue and cluster entry instead
// of waiting for the old one to expire), WORKER_TIMEOUT 10s (a delivery
// ends before the broker's 15 s hands it out again), and native workers
// isolated in a sandboxed host process unless NATIVE_ISOLATION says
// otherwise, as deploy/k8s runs them: a native worker that crashes costs
// its host process, never the stack (in-process, the faster choice, must
// be asked for: NATIVE_ISOLATION=in-process make run).
func NodeEnv(getenv func(string) string) []string {
	env := []string{"WORKMANAGER_NODE_ID=local", "WORKER_TIMEOUT=10s"}
	if getenv("NATIVE_ISOLATION") == "" {
		env = append(env, "NATIVE_ISOLATION=process")
	}
	return env
}

// Port is one address a stack will listen on, named for a person: what
// listens there and the devstack flag that moves it.
type Port struct {
	Addr, What, Flag string
}

// CheckPortsFree fails at once, naming the first address of ports that
// something already listens on (another `make run`, usually), instead of
// starting servers that cannot bind and a stack that attaches to the
// other one's.
func CheckPortsFree(ports []Port) error {
	for _, p := range ports {
		ln, err := net.Listen("tcp", p.Addr)
		if err != nil {
			return fmt.Errorf("%s (%s) is already in use (%v): is another `make run` going? Stop it, or move this one: make run RUN_FLAGS=\"%s PORT\"", p.Addr, p.What, err, p.Flag)
		}
		ln.Close()
	}
	return nil
}
