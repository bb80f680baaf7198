package validate

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// What an operator of the cluster needs beyond "it starts": draining
// nodes during an outage, shutting down without losing lock releases,
// no double runs of a backlog, metrics, credentials, zones, room for the
// largest code blob, and the sidecar image's build (issue 46, item 8).

// variant is one build with its two Deployments and their variables.
type variant struct {
	dir, pubsubType string
	b               *Build
	c               *checker
	node, api       *appsv1.Deployment
	nodeEnv, apiEnv map[string]corev1.EnvVar
}

func eachBuild(t *testing.T, f func(t *testing.T, v *variant)) {
	t.Helper()
	secrets := exampleSecrets(t)
	for dir, pubsubType := range builds {
		t.Run(dir, func(t *testing.T) {
			b, err := LoadBuild(root, dir)
			if err != nil {
				t.Fatal(err)
			}
			f(t, newVariant(t, dir, pubsubType, b, secrets))
		})
	}
}

func newVariant(t *testing.T, dir, pubsubType string, b *Build, secrets map[string]map[string]bool) *variant {
	t.Helper()
	c := &checker{t: t, b: b, secrets: secrets, usedSec: map[string]bool{}}
	v := &variant{dir: dir, pubsubType: pubsubType, b: b, c: c}
	v.node, _ = b.Get("Deployment", nodeDeployment).(*appsv1.Deployment)
	v.api, _ = b.Get("Deployment", apiDeployment).(*appsv1.Deployment)
	if v.node == nil || v.api == nil {
		t.Fatalf("the build needs the Deployments %s and %s", nodeDeployment, apiDeployment)
	}
	nc, ac := container(v.node, nodeContainer), container(v.api, apiContainer)
	if nc == nil || ac == nil {
		t.Fatalf("containers %q and %q expected", nodeContainer, apiContainer)
	}
	v.nodeEnv, v.apiEnv = c.env("node", nc), c.env("api", ac)
	return v
}

// operations runs every check of this file on one variant (also used for
// the build the operator's guide describes, guide_test.go).
func (v *variant) operations() {
	v.pdbsAllowUnhealthyEviction()
	v.shutdownFitsDaprdBlock()
	v.queuedNotRedelivered()
	v.metricsScraped()
	v.ownServiceAccounts()
	v.zoneSpread()
	v.priority()
	v.bodySizeMargin()
}

func TestOperations(t *testing.T) {
	eachBuild(t, func(t *testing.T, v *variant) { v.operations() })
}

// pdbsAllowUnhealthyEviction: a pod that is not ready (the broker or
// Temporal is down, a node recovers) may be evicted. With the default
// policy (IfHealthyBudget) an unready pod is evicted only while the budget
// holds, so during an outage that makes every node unready `kubectl drain`
// hangs.
func (v *variant) pdbsAllowUnhealthyEviction() {
	for _, d := range v.b.Find("PodDisruptionBudget") {
		p := d.Obj.(*policyv1.PodDisruptionBudget)
		if pol := p.Spec.UnhealthyPodEvictionPolicy; pol == nil || *pol != policyv1.AlwaysAllow {
			v.c.errorf("PodDisruptionBudget %s: set unhealthyPodEvictionPolicy: AlwaysAllow, or a drain during a broker or Temporal outage waits for the outage to end", p.Name)
		}
	}
}

// nodeShutdownBounds reads the node's shutdown steps around SHUTDOWN_GRACE
// from the sources (read only): the wait for the loops that end with the
// signal before the drain starts (cmd/worker/services.go, signalLoopStop),
// the final worker statistics flush (internal/workerstats), detaching
// every worker and releasing its group locks (cmd/worker/services.go,
// n.Shutdown) and leaving the membership (internal/cluster).
func nodeShutdownBounds(t *testing.T) (loops, stats, detach, leave time.Duration) {
	t.Helper()
	read := func(file string, re *regexp.Regexp) time.Duration {
		b, err := os.ReadFile(filepath.Join(repo, file))
		if err != nil {
			t.Fatal(err)
		}
		m := re.FindSubmatch(b)
		if m == nil {
			t.Fatalf("%s: no match for %s; the node's shutdown changed: update the bound here and dapr.io/block-shutdown-duration in base/node.yaml", file, re)
		}
		n, _ := strconv.Atoi(string(m[1]))
		return time.Duration(n) * time.Second
	}
	svc, err := os.ReadFile(filepath.Join(repo, "cmd", "worker", "services.go"))
	if err != nil {
		t.Fatal(err)
	}
	// The statistics' loop is detached from the signal and stopped (its
	// last flush waited for) before the node shuts down.
	if !regexp.MustCompile(`startstop\.Loop\("worker stats", func\(ctx context\.Context\) \{ p\.stats\.Run\(`).Match(svc) {
		t.Fatal("cmd/worker/services.go no longer stops the statistics' loop (and waits for its last flush) as a service: update nodeShutdownBounds")
	}
	// Each loop that ends with the signal is waited for in turn, up to
	// signalLoopStop each.
	per := read("cmd/worker/services.go", regexp.MustCompile(`const signalLoopStop = (\d+) \* time\.Millisecond`)) / time.Second * time.Millisecond
	loops = per * time.Duration(strings.Count(string(svc), ".StopWithin(signalLoopStop)"))
	stats = read("internal/workerstats/workerstats.go", regexp.MustCompile(`context\.WithTimeout\(context\.WithoutCancel\(ctx\), (\d+)\*time\.Second\)`))
	detach = read("cmd/worker/services.go", regexp.MustCompile(`context\.WithTimeout\(context\.Background\(\), (\d+)\*time\.Second\)\s*\n\s*defer cancel\(\)\s*\n\s*p\.n\.Shutdown\(`))
	leave = read("internal/cluster/cluster.go", regexp.MustCompile(`context\.WithTimeout\(context\.Background\(\), (\d+)\*time\.Second\)\s*\n\s*defer cancel\(\)\s*\n\s*if err := m\.Leave\(`))
	return loops, stats, detach, leave
}

// shutdownFitsDaprdBlock: daprd keeps the state store and publishing for
// block-shutdown-duration after SIGTERM; the node needs them until it has
// drained (SHUTDOWN_GRACE), flushed its statistics, detached its workers
// (group lock releases) and left the membership. Shorter, and the lock
// releases and the leave fail: peers wait out the locks' age and the
// membership's expiry.
func (v *variant) shutdownFitsDaprdBlock() {
	loops, stats, detach, leave := nodeShutdownBounds(v.c.t)
	worst := loops + v.c.duration(v.nodeEnv, "SHUTDOWN_GRACE") + stats + detach + leave
	if block := v.c.blockShutdown(v.node); block <= worst {
		v.c.errorf("node: dapr.io/block-shutdown-duration %s must exceed the node's worst-case shutdown, %s (%s loops + SHUTDOWN_GRACE + %s statistics + %s detach + %s leave)", block, worst, loops, stats, detach, leave)
	}
}

// longestStay is how long a message can stay with a node before its ack:
// up to WORKER_QUEUE_WAIT for room in a worker's queue, then the
// WORKER_QUEUE_DEPTH messages ahead of it, run WORKER_MAX_CONCURRENCY at a
// time (a batching engine may run more, never fewer), each up to
// WORKER_TIMEOUT plus the group lock's retries, then its own attempt.
func (v *variant) longestStay() time.Duration {
	c, env := v.c, v.nodeEnv
	lock := time.Duration(c.integer(env, "GROUP_LOCK_RETRY_BASE_DELAY_MS")) * time.Millisecond * time.Duration(1<<c.integer(env, "GROUP_LOCK_MAX_RETRIES")-1)
	conc, depth := c.integer(env, "WORKER_MAX_CONCURRENCY"), c.integer(env, "WORKER_QUEUE_DEPTH")
	if conc < 1 {
		conc = 1
	}
	rounds := (depth + conc - 1) / conc
	return c.duration(env, "WORKER_QUEUE_WAIT") + time.Duration(1+rounds)*(c.duration(env, "WORKER_TIMEOUT")+lock)
}

// queuedNotRedelivered: Redis streams hand a message pending for longer
// than processingTimeout to another consumer; if it is still waiting in a
// worker's queue, it then runs twice.
func (v *variant) queuedNotRedelivered() {
	if v.pubsubType != "pubsub.redis" {
		return
	}
	name, _ := v.c.value(v.nodeEnv, "DAPR_PUBSUB")
	for _, d := range v.b.Find("Component") {
		comp := d.Obj.(*DaprComponent)
		if comp.Metadata.Name != name {
			continue
		}
		m, ok := comp.Meta("processingTimeout")
		if !ok || m.Value == nil {
			v.c.errorf("Component %s: no processingTimeout", name)
			return
		}
		pt, err := time.ParseDuration(*m.Value)
		if err != nil {
			v.c.errorf("Component %s: processingTimeout: %v", name, err)
		}
		if most := v.longestStay(); pt <= most {
			v.c.errorf("Component %s: processingTimeout %s must exceed the longest a message stays with a node, %s (WORKER_QUEUE_WAIT + (1 + WORKER_QUEUE_DEPTH/WORKER_MAX_CONCURRENCY) x (WORKER_TIMEOUT + group lock retries)): a backlogged message still queued is handed to another node and runs twice; raise processingTimeout or lower WORKER_QUEUE_DEPTH", name, pt, most)
		}
	}
}

// metricsScraped: the node's /metrics (its HTTP port) is announced to
// Prometheus. The API serves no metrics, so it announces none.
func (v *variant) metricsScraped() {
	a := v.node.Spec.Template.Annotations
	port := v.c.listenPort("node", v.nodeEnv, "WORKMANAGER_HTTP_ADDR")
	if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != strconv.Itoa(int(port)) || a["prometheus.io/path"] != "/metrics" {
		v.c.errorf("node: its metrics are not scraped: set prometheus.io/scrape \"true\", prometheus.io/port %q, prometheus.io/path /metrics (or document a PodMonitor)", strconv.Itoa(int(port)))
	}
	a = v.api.Spec.Template.Annotations
	port = v.c.listenPort("api", v.apiEnv, "WORKMANAGER_API_HEALTH_ADDR")
	if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != strconv.Itoa(int(port)) || a["prometheus.io/path"] != "/metrics" {
		v.c.errorf("api: its metrics are not scraped: set prometheus.io/scrape \"true\", prometheus.io/port %q, prometheus.io/path /metrics (cmd/api serves them beside /health)", strconv.Itoa(int(port)))
	}
}

// ownServiceAccounts: each Deployment runs as a service account of its
// own that the build creates, with no token mounted (neither the node nor
// the API calls the Kubernetes API; a privileged node must carry no
// credentials a sandbox escape could use).
func (v *variant) ownServiceAccounts() {
	for _, d := range []*appsv1.Deployment{v.node, v.api} {
		ps := d.Spec.Template.Spec
		name := ps.ServiceAccountName
		if name == "" || name == "default" {
			v.c.errorf("%s: runs as the namespace's default service account: give it one of its own (serviceAccountName)", d.Name)
			continue
		}
		sa, _ := v.b.Get("ServiceAccount", name).(*corev1.ServiceAccount)
		if sa == nil {
			v.c.errorf("%s: serviceAccountName %s, which the build does not create", d.Name, name)
		} else if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
			v.c.errorf("ServiceAccount %s: set automountServiceAccountToken: false", name)
		}
		if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
			v.c.errorf("%s: set automountServiceAccountToken: false on the pod: it does not call the Kubernetes API", d.Name)
		}
		if name == v.otherSA(d) {
			v.c.errorf("%s: shares its service account with the other Deployment", d.Name)
		}
	}
}

func (v *variant) otherSA(d *appsv1.Deployment) string {
	if d == v.node {
		return v.api.Spec.Template.Spec.ServiceAccountName
	}
	return v.node.Spec.Template.Spec.ServiceAccountName
}

// zoneSpread: each Deployment's pods spread across zones (a soft
// constraint: a single-zone cluster still schedules them).
func (v *variant) zoneSpread() {
	for _, d := range []*appsv1.Deployment{v.node, v.api} {
		ok := false
		for _, tsc := range d.Spec.Template.Spec.TopologySpreadConstraints {
			sel, err := metav1.LabelSelectorAsSelector(tsc.LabelSelector)
			if err == nil && tsc.TopologyKey == "topology.kubernetes.io/zone" && !sel.Empty() && sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				ok = true
			}
		}
		if !ok {
			v.c.errorf("%s: no topologySpreadConstraints on topology.kubernetes.io/zone selecting its pods: one zone can hold all of them", d.Name)
		}
	}
}

// priority: both Deployments name a PriorityClass the build creates,
// above ordinary workloads and below the system classes (a user class may
// not exceed 1,000,000,000), not the cluster's global default (which
// would raise every other pod too).
func (v *variant) priority() {
	for _, d := range []*appsv1.Deployment{v.node, v.api} {
		name := d.Spec.Template.Spec.PriorityClassName
		if name == "" {
			v.c.errorf("%s: no priorityClassName: its pods are preempted as early as any ordinary workload's", d.Name)
			continue
		}
		pc, _ := v.b.Get("PriorityClass", name).(*schedulingv1.PriorityClass)
		switch {
		case pc == nil:
			v.c.errorf("%s: priorityClassName %s, which the build does not create", d.Name, name)
		case pc.Value <= 0 || pc.Value > 1_000_000_000:
			v.c.errorf("PriorityClass %s: value %d, want above 0 (ordinary workloads) and at most 1000000000 (user classes)", name, pc.Value)
		case pc.GlobalDefault:
			v.c.errorf("PriorityClass %s: globalDefault raises every pod without a class: set it false", name)
		}
	}
}

// bodyMargin is the room daprd's max-body-size leaves above the largest
// code blob, for the request around it (key, metadata, gRPC framing).
const bodyMargin = 1 << 20

// bodySizeMargin: daprd's max-body-size exceeds the largest code blob
// (CODE_URL_MAX_BYTES; API_MAX_CODE_BYTES on the API) by bodyMargin, and
// the node's DAPR_MAX_BODY_BYTES is the annotation's value.
func (v *variant) bodySizeMargin() {
	for _, x := range []struct {
		d     *appsv1.Deployment
		env   map[string]corev1.EnvVar
		blobs []string
	}{{v.node, v.nodeEnv, []string{"CODE_URL_MAX_BYTES"}}, {v.api, v.apiEnv, []string{"CODE_URL_MAX_BYTES", "API_MAX_CODE_BYTES"}}} {
		s := x.d.Spec.Template.Annotations["dapr.io/max-body-size"]
		q, err := resource.ParseQuantity(s)
		if err != nil {
			v.c.errorf("%s: dapr.io/max-body-size %q: %v", x.d.Name, s, err)
			continue
		}
		largest := 0
		for _, n := range x.blobs {
			largest = max(largest, v.c.integer(x.env, n))
		}
		if q.Value() < int64(largest+bodyMargin) {
			v.c.errorf("%s: dapr.io/max-body-size %s (%d bytes) leaves less than %d bytes above the largest code blob (%d): a blob of the largest size fails in daprd", x.d.Name, s, q.Value(), bodyMargin, largest)
		}
		if x.d == v.node {
			if got := v.c.integer(x.env, "DAPR_MAX_BODY_BYTES"); int64(got) != q.Value() {
				v.c.errorf("node: DAPR_MAX_BODY_BYTES %d, but dapr.io/max-body-size is %d bytes", got, q.Value())
			}
		}
	}
}

// TestKafkaDaprdIsCompiled: the sidecar image's daprd is built with
// -tags kafka (deploy/k8s/Dockerfile), which the default build (make run,
// the tests) leaves out; make test must compile it, or a Kafka-only break
// reaches the image first.
func TestKafkaDaprdIsCompiled(t *testing.T) {
	docker, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`go build[^\n]*-tags[ =]kafka`).Match(docker) {
		t.Fatal("deploy/k8s/Dockerfile: no daprd build with -tags kafka; update this test")
	}
	mk, err := os.ReadFile(filepath.Join(repo, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	recipe := func(target string) []string {
		var out []string
		in := false
		for _, l := range strings.Split(string(mk), "\n") {
			switch {
			case strings.HasPrefix(l, target+":"):
				in = true
				out = append(out, l)
			case in && strings.HasPrefix(l, "\t"):
				out = append(out, l)
			case in:
				return out
			}
		}
		return out
	}
	testGo := strings.Join(recipe("test-go"), "\n")
	if !strings.Contains(testGo, "daprd-test") {
		t.Fatal("Makefile: test-go no longer runs daprd-test; update this test")
	}
	daprdTest := strings.Join(recipe("daprd-test"), "\n")
	if !regexp.MustCompile(`cd deploy/dapr/daprd && [^\n]*go (build|vet)[^\n]*-tags[ =]kafka`).MatchString(daprdTest) {
		t.Errorf("Makefile: daprd-test (run by make test) does not compile deploy/dapr/daprd with -tags kafka, the sidecar image's build:\n%s", daprdTest)
	}
}
