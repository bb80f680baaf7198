// Command devstack is `make run`: it starts the whole WorkManager stack on
// loopback — Redis, the Temporal dev server with its Web UI, daprd, a worker
// node (or -nodes N of them, each with its own daprd) and the control API —
// keeps its data in .run/ so that a restart keeps the workers, prints where
// everything is, restarts a node when it dies (with backoff, as Kubernetes
// would), and stops it all on Ctrl-C.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/virtufin/workmanager/internal/devstack"
)

func main() {
	var o devstack.Options
	var bins, apiAddr, apiHealthAddr, nodeAddr string
	var mtls bool
	var nodeCount int
	var nodeLabels string
	flag.StringVar(&o.Dir, "dir", ".run", "data and log directory (kept across restarts)")
	flag.StringVar(&o.ToolsBin, "tools", ".tools/bin", "folder with the temporal and daprd binaries")
	flag.StringVar(&bins, "bin", "bin", "folder with the worker and api binaries")
	flag.IntVar(&o.RedisPort, "redis-port", 6380, "Redis port")
	flag.IntVar(&o.TemporalPort, "temporal-port", 7233, "Temporal frontend port")
	flag.IntVar(&o.UIPort, "ui-port", 8233, "Temporal Web UI port")
	flag.IntVar(&o.DaprGRPCPort, "dapr-grpc-port", 50001, "daprd gRPC port")
	flag.IntVar(&o.DaprHTTPPort, "dapr-http-port", 3500, "daprd HTTP port")
	flag.StringVar(&apiAddr, "api-addr", "127.0.0.1:50051", "control API address")
	flag.StringVar(&nodeAddr, "node-addr", "127.0.0.1:8080", "node HTTP (health) address")
	flag.StringVar(&apiHealthAddr, "api-health-addr", "127.0.0.1:8081", "control API HTTP health address")
	flag.IntVar(&nodeCount, "nodes", 1, "how many worker nodes to run, each with its own daprd (same app id), node id, health address and state directory")
	flag.StringVar(&nodeLabels, "node-labels", "", "each node's NODE_LABELS, separated by ';' (e.g. \"zone=a;zone=b;zone=c\")")
	flag.BoolVar(&mtls, "mtls", false, "serve the control API over TLS and accept client certificates (a dev CA and certificates under <dir>/tls)")
	// Quicker redelivery than the manifest's 45s, for a snappy dev loop: a
	// message answered RETRY comes back after about 15s. The node's
	// WORKER_TIMEOUT is 10s here, so that a delivery ends before the broker
	// hands it out again (see docs/architecture.md, delivery guarantees).
	flag.DurationVar(&o.RedeliverInterval, "redeliver-interval", 2*time.Second, "Redis streams redelivery scan interval")
	flag.DurationVar(&o.ProcessingTimeout, "processing-timeout", 15*time.Second, "how long a message may stay unacknowledged before it is redelivered")
	flag.StringVar(&o.DaprAPIToken, "dapr-api-token", os.Getenv("DAPR_API_TOKEN"), "make daprd require this API token (default $DAPR_API_TOKEN; empty: none)")
	flag.Parse()
	nodes, err := devstack.DevNodes(nodeCount, nodeLabels)
	if err == nil {
		err = run(o, bins, apiAddr, apiHealthAddr, nodeAddr, mtls, nodes)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "devstack:", err)
		os.Exit(1)
	}
}

// node is one running worker node of the stack: its plan, addresses and
// supervisor.
type node struct {
	devstack.DevNode
	addr    string           // its HTTP address (health, readiness, metrics)
	sidecar devstack.Sidecar // its daprd
	sup     *devstack.Supervisor
	done    chan error // the supervisor's result
}

func run(o devstack.Options, bins, apiAddr, apiHealthAddr, nodeAddr string, mtls bool, plan []devstack.DevNode) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	abs, err := filepath.Abs(o.Dir)
	if err != nil {
		return err
	}
	o.Dir = abs
	loop := func(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
	ports := []devstack.Port{
		{Addr: loop(o.RedisPort), What: "Redis", Flag: "-redis-port"},
		{Addr: loop(o.TemporalPort), What: "the Temporal frontend", Flag: "-temporal-port"},
		{Addr: loop(o.UIPort), What: "the Temporal Web UI", Flag: "-ui-port"},
		{Addr: loop(o.DaprGRPCPort), What: "daprd's gRPC API", Flag: "-dapr-grpc-port"},
		{Addr: loop(o.DaprHTTPPort), What: "daprd's HTTP API", Flag: "-dapr-http-port"},
		{Addr: apiAddr, What: "the control API", Flag: "-api-addr"},
		{Addr: apiHealthAddr, What: "the control API's health", Flag: "-api-health-addr"},
		{Addr: nodeAddr, What: "the node's health", Flag: "-node-addr"},
	}
	if err := devstack.CheckPortsFree(ports); err != nil {
		return err
	}
	s, err := devstack.Start(ctx, o)
	if err != nil {
		return err
	}
	defer s.Stop()
	// The first node runs on the stack's daprd at nodeAddr, as it always
	// has; each further one on a daprd of its own (stopped with the stack)
	// and a free loopback port.
	nodes := make([]*node, len(plan))
	for i, n := range plan {
		nodes[i] = &node{DevNode: n, addr: nodeAddr, sidecar: devstack.Sidecar{GRPCAddr: s.DaprGRPCAddr, HTTPAddr: s.DaprHTTPAddr}}
		if i == 0 {
			continue
		}
		port, err := devstack.FreePort()
		if err != nil {
			return fmt.Errorf("pick a port for %s: %w", n.ID(), err)
		}
		nodes[i].addr = loop(port)
		if nodes[i].sidecar, err = s.StartSidecar(ctx, n.SidecarName()); err != nil {
			return fmt.Errorf("start the daprd of %s: %w", n.ID(), err)
		}
	}
	// Each node is kept running as Kubernetes keeps a container: one that
	// dies (a native worker that crashes it in process) is started again
	// with backoff, each restart printed with what its crash journal names;
	// the other nodes, the API and the servers keep running.
	nodeCtx, stopNodes := context.WithCancel(context.Background())
	var started []<-chan struct{}
	for _, n := range nodes {
		n.sup = &devstack.Supervisor{Name: n.Name(), JournalDir: n.StateDir(s.Dir),
			Start: func() (*devstack.Proc, error) {
				return s.StartDevNode(filepath.Join(bins, "worker"), n.addr, n.DevNode, n.sidecar.GRPCAddr, os.Getenv)
			},
			Say: func(line string) { fmt.Fprintln(os.Stderr, "devstack: "+line) }}
		n.done = make(chan error, 1)
		started = append(started, n.sup.Started())
		go func() { n.done <- n.sup.Run(nodeCtx, func(p *devstack.Proc) { p.Stop(40 * time.Second) }) }() // SHUTDOWN_GRACE (30s) to drain
	}
	defer func() {
		stopNodes() // all at once: each drains in parallel
		for _, n := range nodes {
			<-n.done
		}
	}()
	for i, n := range nodes {
		select {
		case <-started[i]:
		case err := <-n.done:
			n.done <- err // for the deferred wait
			return err
		}
	}
	apiEnv := []string{"WORKMANAGER_API_HEALTH_ADDR=" + apiHealthAddr}
	var certs devstack.DevTLSFiles
	if mtls {
		if certs, err = devstack.DevTLS(o.Dir); err != nil {
			return err
		}
		apiEnv = append(apiEnv, certs.Env()...)
	}
	grpcurlTransport := "-plaintext"
	if mtls {
		grpcurlTransport = "-cacert " + relOrAbs(certs.CA)
	}
	// wmctl reads .run/dev-token of the working directory by itself.
	wmctl := relOrAbs(filepath.Join(bins, "wmctl")) + " --addr " + apiAddr
	if tok := relOrAbs(filepath.Join(o.Dir, "dev-token")); tok != filepath.Join(".run", "dev-token") {
		wmctl += " --token-file " + tok
	}
	if mtls {
		wmctl += " --ca " + relOrAbs(certs.CA)
	}
	api, err := s.StartAPI(filepath.Join(bins, "api"), apiAddr, apiEnv...)
	if err != nil {
		return err
	}
	defer api.Stop(5 * time.Second)
	for _, n := range nodes { // they start together: the waits overlap
		if err := waitNodeReady(ctx, n.sup, "http://"+n.addr+"/readyz", 2*time.Minute); err != nil {
			return err
		}
	}
	_, _, err = devstack.DevToken(o.Dir) // StartAPI made it; make sure it is there
	if err != nil {
		return err
	}
	// make run does not build grpcurl (wmctl is the CLI; make test and
	// `make grpcurl` build it): say how to get it when it is not there yet.
	grpcurl := filepath.Join(".tools", "bin", "grpcurl")
	if _, err := os.Stat(grpcurl); err != nil {
		grpcurl = "make grpcurl && " + grpcurl
	}
	fmt.Printf(`
WorkManager is running (data and logs in %s):
  control API (gRPC)   %s        needs a bearer token: the dev token (admin, default tenant) is in %s
                       %s %s -H "authorization: Bearer $(cat %s)" %s list
                       %s list      (the CLI, cmd/wmctl/README.md; events: add 'events --follow --dapr %s')
  API health           http://%s/health   (authentication mode, Temporal, state store)   metrics http://%[10]s/metrics
%s  Temporal frontend    %s
  Temporal Web UI      %s
%s  Redis                %s
Press Ctrl-C to stop; 'make run' again resumes with the same workers.
`, o.Dir, apiAddr, filepath.Join(o.Dir, "dev-token"), grpcurl, grpcurlTransport, relOrAbs(filepath.Join(o.Dir, "dev-token")), apiAddr, wmctl, s.DaprGRPCAddr, apiHealthAddr, nodeLines(nodes, o.Dir, wmctl), s.TemporalAddr, s.UIURL, daprLine(nodes), s.RedisAddr)
	if mtls {
		fmt.Printf(`  The API serves TLS and takes client certificates (dev CA and certificates in %s):
                       %s -cacert %s -cert %s -key %s %s list
`, filepath.Dir(certs.CA), grpcurl, relOrAbs(certs.CA), relOrAbs(certs.ClientCert), relOrAbs(certs.ClientKey), apiAddr)
	}
	if o.DaprAPIToken != "" {
		fmt.Println("  daprd requires its API token: send header 'dapr-api-token: $DAPR_API_TOKEN' to daprd")
	}
	select {
	case <-ctx.Done():
	case <-api.Done():
		return fmt.Errorf("api exited; see %s", api.Log)
	}
	fmt.Println("stopping...")
	return nil
}

// nodeLines are the banner's lines about the nodes, in place of its
// "node health" line: that line alone for one node (as `make run` has
// always printed it), a block per node for several.
func nodeLines(nodes []*node, dir, wmctl string) string {
	if len(nodes) == 1 {
		return fmt.Sprintf("  node health          http://%s/health   (/healthz, /readyz; Prometheus metrics at /metrics)\n", nodes[0].addr)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "  %d worker nodes, Dapr app id %s (%s nodes lists them):\n", len(nodes), devstack.AppID, wmctl)
	for _, n := range nodes {
		fmt.Fprintf(&b, "  node %-15s health http://%s/health   (/healthz, /readyz)   metrics http://%s/metrics\n", n.ID(), n.addr, n.addr)
		fmt.Fprintf(&b, "                       daprd gRPC / HTTP %s / %s   state %s   log %s", n.sidecar.GRPCAddr, n.sidecar.HTTPAddr,
			relOrAbs(n.StateDir(dir)), relOrAbs(filepath.Join(dir, n.LogName()+".log")))
		if n.Labels != "" {
			fmt.Fprintf(&b, "   labels %s", n.Labels)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// daprLine is the banner's "daprd gRPC / HTTP" line: one node's daprd;
// with several nodes each node's block names its own.
func daprLine(nodes []*node) string {
	if len(nodes) != 1 {
		return ""
	}
	return fmt.Sprintf("  daprd gRPC / HTTP    %s / %s\n", nodes[0].sidecar.GRPCAddr, nodes[0].sidecar.HTTPAddr)
}

// waitNodeReady waits until the node answers ready, through its restarts
// (each printed by the supervisor), for at most limit.
func waitNodeReady(ctx context.Context, node *devstack.Supervisor, url string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		p := node.Current()
		if p == nil || p.Exited() { // between a death and its restart
			next := node.Started()
			if q := node.Current(); q != nil && q != p && !q.Exited() {
				continue // restarted meanwhile
			}
			select {
			case <-next:
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Until(deadline)):
				return fmt.Errorf("%s not ready after %s (restarted %d times); see its log", node.Name, limit, node.Restarts())
			}
			continue
		}
		err := devstack.WaitHTTP(ctx, p, url, time.Until(deadline))
		if err == nil || !p.Exited() || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		// It died during start-up: the supervisor restarts it.
	}
}

// relOrAbs is path relative to the working directory when it is below it.
func relOrAbs(path string) string {
	wd, err := os.Getwd()
	if err != nil {
		return path
	}
	if rel, err := filepath.Rel(wd, path); err == nil && filepath.IsLocal(rel) {
		return rel
	}
	return path
}
