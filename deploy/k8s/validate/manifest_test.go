package validate

import (
	"io/fs"
	"net"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

const (
	root = ".."       // deploy/k8s
	repo = "../../.." // the repository

	nodeDeployment, nodeContainer, nodeAppID = "workmanager-node", "node", "workmanager"
	apiDeployment, apiContainer, apiAppID    = "workmanager-api", "api", "workmanager-api"

	// secretsExample shows the Secrets the manifests reference, which are
	// created out of band (docs/scaling.md) and applied by no kustomization.
	secretsExample = "secrets.example.yaml"
)

// builds are the kustomizations one applies, with the pub/sub component
// type each deploys.
var builds = map[string]string{
	".":                     "pubsub.redis",
	"overlays/kafka":        "pubsub.kafka",
	"overlays/unprivileged": "pubsub.redis",
}

// partial are kustomizations only included by others.
var partial = map[string]bool{"base": true, "pubsub/redis": true}

// notSet says which settings the node or the API reads are left out of
// the Deployments on purpose, and why. Everything else is set explicitly,
// defaults included, so that a new setting fails this test until it is
// given a value here.
func notSet(name string) (why string, ok bool) {
	switch {
	case strings.HasPrefix(name, "WM_TEST_"):
		// WM_TEST_PANIC_EXTENSION, WM_TEST_STATE_FAULT_FILE, …: test hooks
		// (docs/configuration.md, "Test hooks"), never in production.
		return "a test hook", true
	case name == "CODE_URL_TEST_ALLOW_LOOPBACK":
		// Admits loopback code URLs for the integration tests only.
		return "test-only", true
	}
	return "", false
}

// shareExempt are settings both commands read that need not come from
// the shared ConfigMap: the pod's own daprd, a per-process log level, and
// the Dapr API token (from its Secret, checked apart).
var shareExempt = map[string]bool{"DAPR_GRPC_ADDRESS": true, "LOG_LEVEL": true, "DAPR_API_TOKEN": true}

// daprAnnotations are the dapr.io/ pod annotations of Dapr 1.14's sidecar
// injector (pkg/injector/annotations) that these manifests may use: a
// misspelt one is silently ignored by the injector, so it fails here.
var daprAnnotations = map[string]bool{
	"dapr.io/enabled": true, "dapr.io/app-id": true, "dapr.io/app-port": true, "dapr.io/config": true,
	"dapr.io/app-protocol": true, "dapr.io/log-level": true, "dapr.io/log-as-json": true,
	"dapr.io/api-token-secret": true, "dapr.io/app-max-concurrency": true, "dapr.io/enable-metrics": true,
	"dapr.io/metrics-port": true, "dapr.io/env": true, "dapr.io/sidecar-cpu-request": true,
	"dapr.io/sidecar-cpu-limit": true, "dapr.io/sidecar-memory-request": true, "dapr.io/sidecar-memory-limit": true,
	"dapr.io/sidecar-image": true, "dapr.io/sidecar-seccomp-profile-type": true, "dapr.io/max-body-size": true,
	"dapr.io/read-buffer-size": true, "dapr.io/graceful-shutdown-seconds": true, "dapr.io/block-shutdown-duration": true,
	"dapr.io/enable-api-logging": true, "dapr.io/sidecar-listen-addresses": true,
	// Needed: WorkManager's daprd has no secretstores.kubernetes
	// (TestDaprdCanCreateItsBuiltinComponents).
	"dapr.io/disable-builtin-k8s-secret-store": true,
}

// reads returns the settings of the node and of the API, from their
// sources.
func reads(t *testing.T) (node, api map[string]bool) {
	t.Helper()
	envconfig := filepath.Join(repo, "internal", "envconfig")
	node, err := EnvReads(filepath.Join(repo, "cmd", "worker"), envconfig)
	if err != nil {
		t.Fatal(err)
	}
	api, err = EnvReads(filepath.Join(repo, "cmd", "api"), envconfig)
	if err != nil {
		t.Fatal(err)
	}
	return node, api
}

// TestSettingsAreFoundInTheSources guards the source scan itself: a
// refactor that hides the settings from it must fail here, not let every
// Deployment pass.
func TestSettingsAreFoundInTheSources(t *testing.T) {
	node, api := reads(t)
	for _, c := range []struct {
		who   string
		got   map[string]bool
		least int
		want  []string
	}{
		{"node", node, 60, []string{"WORKMANAGER_HTTP_ADDR", "SHUTDOWN_GRACE", "SANDBOX", "TEMPORAL_ADDRESS", "DAPR_API_TOKEN", "CODE_URL_MAX_BYTES", "LOG_LEVEL", "WM_TEST_PANIC_EXTENSION"}},
		{"api", api, 30, []string{"WORKMANAGER_API_ADDR", "WORKMANAGER_API_HEALTH_ADDR", "API_TOKENS_FILE", "API_AUTH", "TEMPORAL_NAMESPACE", "DAPR_STATESTORE", "CODE_URL_TIMEOUT", "TENANT_TOPIC_PREFIXES"}},
	} {
		if len(c.got) < c.least {
			t.Errorf("%s: found %d settings in the sources, expected at least %d: %v", c.who, len(c.got), c.least, sortedKeys(c.got))
		}
		for _, w := range c.want {
			if !c.got[w] {
				t.Errorf("%s: %s not found in the sources", c.who, w)
			}
		}
	}
}

// TestDecodingIsStrict shows that the decoder refuses what the manifests
// must not contain.
func TestDecodingIsStrict(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field":          "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\ndatta:\n  A: b\n",
		"unknown nested field":   "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  replica: 3\n",
		"wrong type":             "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  replicas: \"3\"\n",
		"env value not a string": "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  template:\n    spec:\n      containers:\n      - name: c\n        env:\n        - name: N\n          value: 8\n",
		"duplicate field":        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\ndata:\n  A: b\ndata:\n  C: d\n",
		"missing kind":           "apiVersion: v1\nmetadata:\n  name: x\n",
		"unknown kind":           "apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n",
		"wrong apiVersion":       "apiVersion: extensions/v1beta1\nkind: Deployment\nmetadata:\n  name: x\n",
		"Dapr unknown field":     "apiVersion: dapr.io/v1alpha1\nkind: Component\nmetadata:\n  name: x\nspec:\n  type: state.redis\n  version: v1\n  metdata: []\n",
		"Dapr bare number":       "apiVersion: dapr.io/v1alpha1\nkind: Component\nmetadata:\n  name: x\nspec:\n  type: pubsub.redis\n  version: v1\n  metadata:\n  - name: poolSize\n    value: 1100\n",
		"Dapr Configuration":     "apiVersion: dapr.io/v1alpha1\nkind: Configuration\nmetadata:\n  name: x\nspec:\n  tracing:\n    samplingrate: \"1\"\n",
		"kustomization field":    "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresource:\n- a.yaml\n",
		"NetworkPolicy field":    "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: x\nspec:\n  egress:\n  - too: []\n",
	} {
		if _, err := Decode("test", 0, []byte(doc)); err == nil {
			t.Errorf("%s: decoded without an error", name)
		}
	}
	if _, err := Decode("test", 0, []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\ndata:\n  A: b\n")); err != nil {
		t.Errorf("a valid document: %v", err)
	}
	if n := len(SplitDocs([]byte("# only a comment\n---\na: 1\n---\n\n---\nb: 2\n"))); n != 2 {
		t.Errorf("SplitDocs: %d documents, want 2", n)
	}
}

// TestEveryManifestIsDecodedAndDeployed decodes every YAML file under
// deploy/k8s strictly and checks that each is part of a build (or is the
// Secrets example), and that every kustomization is a known build.
func TestEveryManifestIsDecodedAndDeployed(t *testing.T) {
	used := map[string]bool{secretsExample: true}
	for dir := range optionalExamples { // applied by choice (autoscale_test.go)
		b, err := LoadBuild(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range b.Files {
			used[f] = true
		}
	}
	for dir := range builds {
		b, err := LoadBuild(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range b.Files {
			used[f] = true
		}
	}
	n := 0
	err := walkK8s(func(p, rel string, d fs.DirEntry) error {
		if d.IsDir() {
			return nil
		}
		if ext := filepath.Ext(p); ext != ".yaml" && ext != ".yml" {
			return nil
		}
		n++
		if _, err := LoadFile(root, rel); err != nil {
			t.Error(err)
		}
		if filepath.Base(rel) == "kustomization.yaml" {
			if dir := filepath.Dir(rel); builds[dir] == "" && !partial[dir] && !optionalExamples[dir] {
				t.Errorf("%s: a kustomization this test does not know (add it to builds)", rel)
			}
		}
		if !used[rel] {
			t.Errorf("%s: no kustomization deploys it", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 10 {
		t.Fatalf("found only %d manifest files under %s", n, root)
	}
}

func TestBuilds(t *testing.T) {
	nodeReads, apiReads := reads(t)
	secrets := exampleSecrets(t)
	for dir, pubsubType := range builds {
		t.Run(dir, func(t *testing.T) {
			b, err := LoadBuild(root, dir)
			if err != nil {
				t.Fatal(err)
			}
			c := &checker{t: t, b: b, secrets: secrets}
			c.run(pubsubType, nodeReads, apiReads)
		})
	}
}

// exampleSecrets returns the keys of each Secret in secrets.example.yaml.
func exampleSecrets(t *testing.T) map[string]map[string]bool {
	t.Helper()
	docs, err := LoadFile(root, secretsExample)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]bool{}
	for _, d := range docs {
		s, ok := d.Obj.(*corev1.Secret)
		if !ok {
			t.Fatalf("%s: only Secrets belong there", d)
		}
		keys := map[string]bool{}
		for k := range s.StringData {
			keys[k] = true
		}
		for k := range s.Data {
			keys[k] = true
		}
		out[s.Name] = keys
	}
	return out
}

type checker struct {
	t       *testing.T
	b       *Build
	secrets map[string]map[string]bool
	usedSec map[string]bool
}

func (c *checker) errorf(format string, args ...any) {
	c.t.Helper()
	c.t.Errorf(format, args...)
}

func (c *checker) run(pubsubType string, nodeReads, apiReads map[string]bool) {
	t := c.t
	c.usedSec = map[string]bool{}
	node, _ := c.b.Get("Deployment", nodeDeployment).(*appsv1.Deployment)
	api, _ := c.b.Get("Deployment", apiDeployment).(*appsv1.Deployment)
	if node == nil || api == nil {
		t.Fatalf("the build needs the Deployments %s and %s", nodeDeployment, apiDeployment)
	}
	if n := len(c.b.Find("Deployment")); n != 2 {
		c.errorf("%d Deployments, want 2", n)
	}
	nc, ac := container(node, nodeContainer), container(api, apiContainer)
	if nc == nil || ac == nil {
		t.Fatalf("containers %q and %q expected", nodeContainer, apiContainer)
	}
	nodeEnv, apiEnv := c.env("node", nc), c.env("api", ac)
	c.settings("node (cmd/worker)", nodeEnv, nodeReads)
	c.settings("api (cmd/api)", apiEnv, apiReads)
	c.shared(nodeEnv, apiEnv, nodeReads, apiReads, node, api)

	for _, d := range []*appsv1.Deployment{node, api} {
		c.deployment(d)
	}
	c.pdbs(node, api)
	c.onePerHost(node)
	if node.Spec.Replicas == nil || *node.Spec.Replicas < 2 || api.Spec.Replicas == nil || *api.Spec.Replicas < 2 {
		c.errorf("the nodes and the API need at least 2 replicas each")
	}
	c.dapr(node, nodeAppID)
	c.dapr(api, apiAppID)

	// The node: reachable probes on /readyz and /healthz, and a grace
	// period that covers SHUTDOWN_GRACE and daprd's shutdown.
	httpPort := c.listenPort("node", nodeEnv, "WORKMANAGER_HTTP_ADDR")
	c.probe("node readiness", nc, nc.ReadinessProbe, "/readyz", httpPort)
	c.probe("node liveness", nc, nc.LivenessProbe, "/healthz", httpPort)
	if nc.StartupProbe != nil {
		c.probe("node startup", nc, nc.StartupProbe, "/healthz", httpPort)
	}
	shutdownGrace := c.duration(nodeEnv, "SHUTDOWN_GRACE")
	tgps := time.Duration(*node.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
	if tgps <= shutdownGrace {
		c.errorf("node: terminationGracePeriodSeconds %s must exceed SHUTDOWN_GRACE %s", tgps, shutdownGrace)
	}
	if block := c.blockShutdown(node); block <= shutdownGrace {
		c.errorf("node: dapr.io/block-shutdown-duration %s must exceed SHUTDOWN_GRACE %s, so that daprd still publishes and writes state while the node drains", block, shutdownGrace)
	}

	// The API: gRPC and health ports as configured; readiness on /health,
	// because the API's /readyz waits for a start-up recovery check that
	// only nodes have (internal/health.NewEmpty), so it never passes.
	grpcPort := c.listenPort("api", apiEnv, "WORKMANAGER_API_ADDR")
	healthPort := c.listenPort("api", apiEnv, "WORKMANAGER_API_HEALTH_ADDR")
	if p, ok := containerPort(ac, "grpc"); !ok || p != grpcPort {
		c.errorf("api: container port grpc is %d, WORKMANAGER_API_ADDR listens on %d", p, grpcPort)
	}
	c.probe("api readiness", ac, ac.ReadinessProbe, "/health", healthPort)
	c.probe("api liveness", ac, ac.LivenessProbe, "/healthz", healthPort)
	c.service(api, node, ac)
	c.apiTokens(api, ac, apiEnv)
	c.secretFile("node", node, nc, nodeEnv, "REDIS_CHECK_PASSWORD_FILE")
	c.secretFile("api", api, ac, apiEnv, "REDIS_CHECK_PASSWORD_FILE")

	c.security(node, nc, nodeEnv)
	c.networkPolicy(node, nodeEnv)
	c.components(pubsubType, nodeEnv, nodeAppID, apiAppID)
	c.namespace()
	for name := range c.secrets {
		if !c.usedSec[name] {
			c.errorf("%s: Secret %s is referenced by nothing", secretsExample, name)
		}
	}
}

func container(d *appsv1.Deployment, name string) *corev1.Container {
	for i := range d.Spec.Template.Spec.Containers {
		if c := &d.Spec.Template.Spec.Containers[i]; c.Name == name {
			return c
		}
	}
	return nil
}

func containerPort(c *corev1.Container, name string) (int32, bool) {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort, true
		}
	}
	return 0, false
}

// env returns the container's variables by name; a name set twice fails.
func (c *checker) env(who string, ct *corev1.Container) map[string]corev1.EnvVar {
	out := map[string]corev1.EnvVar{}
	if len(ct.EnvFrom) > 0 {
		c.errorf("%s: envFrom hides which settings are set; name each variable", who)
	}
	for _, e := range ct.Env {
		if _, dup := out[e.Name]; dup {
			c.errorf("%s: %s is set twice", who, e.Name)
		}
		out[e.Name] = e
		switch {
		case e.ValueFrom == nil:
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			cm, _ := c.b.Get("ConfigMap", ref.Name).(*corev1.ConfigMap)
			if cm == nil {
				c.errorf("%s: %s refers to ConfigMap %s, which the build lacks", who, e.Name, ref.Name)
			} else if _, ok := cm.Data[ref.Key]; !ok {
				c.errorf("%s: %s refers to key %s of ConfigMap %s, which it lacks", who, e.Name, ref.Key, ref.Name)
			}
		case e.ValueFrom.SecretKeyRef != nil:
			c.secretKey(who+": "+e.Name, e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key)
		}
	}
	return out
}

func (c *checker) secretKey(what, name, key string) {
	c.usedSec[name] = true
	keys, ok := c.secrets[name]
	switch {
	case !ok:
		c.errorf("%s: Secret %s is not in %s", what, name, secretsExample)
	case key != "" && !keys[key]:
		c.errorf("%s: Secret %s has no key %s in %s", what, name, key, secretsExample)
	}
}

// value is a variable's value, literal or from the build's ConfigMap.
func (c *checker) value(env map[string]corev1.EnvVar, name string) (string, bool) {
	e, ok := env[name]
	switch {
	case !ok:
		return "", false
	case e.ValueFrom == nil:
		return e.Value, true
	case e.ValueFrom.ConfigMapKeyRef != nil:
		cm, _ := c.b.Get("ConfigMap", e.ValueFrom.ConfigMapKeyRef.Name).(*corev1.ConfigMap)
		if cm == nil {
			return "", false
		}
		v, ok := cm.Data[e.ValueFrom.ConfigMapKeyRef.Key]
		return v, ok
	}
	return "", false
}

func (c *checker) duration(env map[string]corev1.EnvVar, name string) time.Duration {
	v, _ := c.value(env, name)
	d, err := time.ParseDuration(v)
	if err != nil {
		c.errorf("%s=%q: %v", name, v, err)
	}
	return d
}

func (c *checker) integer(env map[string]corev1.EnvVar, name string) int {
	v, _ := c.value(env, name)
	n, err := strconv.Atoi(v)
	if err != nil {
		c.errorf("%s=%q: %v", name, v, err)
	}
	return n
}

// settings: every variable the command reads is set, but the test hooks,
// which must not be; and nothing is set that it does not read.
func (c *checker) settings(who string, env map[string]corev1.EnvVar, reads map[string]bool) {
	for _, n := range sortedKeys(reads) {
		_, set := env[n]
		why, skip := notSet(n)
		switch {
		case skip && set:
			c.errorf("%s: sets %s, %s", who, n, why)
		case !skip && !set:
			c.errorf("%s: reads %s, which its Deployment does not set (set it, even to its default)", who, n)
		}
	}
	for _, n := range sortedKeys(env) {
		if !reads[n] {
			c.errorf("%s: sets %s, which it does not read", who, n)
		}
	}
}

// shared: what both read comes from one ConfigMap key, and the Dapr API
// token from the Secret daprd is given.
func (c *checker) shared(nodeEnv, apiEnv map[string]corev1.EnvVar, nodeReads, apiReads map[string]bool, node, api *appsv1.Deployment) {
	for _, n := range sortedKeys(nodeReads) {
		if _, skip := notSet(n); !apiReads[n] || skip || shareExempt[n] {
			continue
		}
		a, b := nodeEnv[n].ValueFrom, apiEnv[n].ValueFrom
		if a == nil || b == nil || a.ConfigMapKeyRef == nil || b.ConfigMapKeyRef == nil ||
			a.ConfigMapKeyRef.Name != b.ConfigMapKeyRef.Name || a.ConfigMapKeyRef.Key != b.ConfigMapKeyRef.Key {
			c.errorf("%s is read by the nodes and the API: both must take it from the same ConfigMap key", n)
		}
	}
	for _, d := range []struct {
		env map[string]corev1.EnvVar
		dep *appsv1.Deployment
	}{{nodeEnv, node}, {apiEnv, api}} {
		e := d.env["DAPR_API_TOKEN"]
		want := d.dep.Spec.Template.Annotations["dapr.io/api-token-secret"]
		if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || want == "" ||
			e.ValueFrom.SecretKeyRef.Name != want || e.ValueFrom.SecretKeyRef.Key != "token" {
			c.errorf("%s: DAPR_API_TOKEN must come from key \"token\" of the Secret named by dapr.io/api-token-secret (%q), which daprd gets", d.dep.Name, want)
		}
	}
}

// listenPort checks that an address listens on every interface of the pod
// and returns its port.
func (c *checker) listenPort(who string, env map[string]corev1.EnvVar, name string) int32 {
	v, _ := c.value(env, name)
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		c.errorf("%s: %s=%q: %v", who, name, v, err)
		return 0
	}
	if host != "" && host != "0.0.0.0" && host != "::" {
		c.errorf("%s: %s=%q listens on %s only; in a pod it must listen on 0.0.0.0", who, name, v, host)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		c.errorf("%s: %s=%q: %v", who, name, v, err)
	}
	return int32(p)
}

func (c *checker) probe(what string, ct *corev1.Container, p *corev1.Probe, path string, port int32) {
	if p == nil || p.HTTPGet == nil {
		c.errorf("%s: an HTTP GET probe on %s expected", what, path)
		return
	}
	if p.HTTPGet.Path != path {
		c.errorf("%s: probes %s, want %s", what, p.HTTPGet.Path, path)
	}
	got := p.HTTPGet.Port.IntVal
	if p.HTTPGet.Port.StrVal != "" {
		var ok bool
		if got, ok = containerPort(ct, p.HTTPGet.Port.StrVal); !ok {
			c.errorf("%s: port %q is not a container port", what, p.HTTPGet.Port.StrVal)
		}
	}
	if got != port {
		c.errorf("%s: probes port %d, the server listens on %d", what, got, port)
	}
}

func (c *checker) deployment(d *appsv1.Deployment) {
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || d.Spec.Selector == nil || sel.Empty() || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		c.errorf("%s: its selector must select its pods (%v)", d.Name, err)
	}
	ps := d.Spec.Template.Spec
	if ps.TerminationGracePeriodSeconds == nil {
		c.errorf("%s: terminationGracePeriodSeconds not set", d.Name)
		return
	}
	tgps := time.Duration(*ps.TerminationGracePeriodSeconds) * time.Second
	if need := c.blockShutdown(d) + c.gracefulShutdown(d); tgps <= need {
		c.errorf("%s: terminationGracePeriodSeconds %s must exceed daprd's block-shutdown-duration plus graceful-shutdown-seconds (%s)", d.Name, tgps, need)
	}
	for _, ct := range ps.Containers {
		if i := strings.LastIndex(ct.Image, ":"); i < 0 || i == len(ct.Image)-1 || strings.Contains(ct.Image[i:], "/") {
			c.errorf("%s: image %q has no tag", d.Name, ct.Image)
		}
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if _, ok := ct.Resources.Requests[r]; !ok {
				c.errorf("%s/%s: no %s request", d.Name, ct.Name, r)
			}
			if _, ok := ct.Resources.Limits[r]; !ok {
				c.errorf("%s/%s: no %s limit", d.Name, ct.Name, r)
			}
		}
	}
}

func (c *checker) blockShutdown(d *appsv1.Deployment) time.Duration {
	v, ok := d.Spec.Template.Annotations["dapr.io/block-shutdown-duration"]
	if !ok {
		return 0
	}
	x, err := time.ParseDuration(v)
	if err != nil {
		c.errorf("%s: dapr.io/block-shutdown-duration %q: %v", d.Name, v, err)
	}
	return x
}

func (c *checker) gracefulShutdown(d *appsv1.Deployment) time.Duration {
	v, ok := d.Spec.Template.Annotations["dapr.io/graceful-shutdown-seconds"]
	if !ok {
		return 5 * time.Second // daprd's default
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		c.errorf("%s: dapr.io/graceful-shutdown-seconds %q: %v", d.Name, v, err)
	}
	return time.Duration(n) * time.Second
}

// pdbs: each Deployment's pods are selected by exactly one budget, which
// selects no other Deployment's pods and lets one pod go at a time.
func (c *checker) pdbs(deps ...*appsv1.Deployment) {
	pdbs := c.b.Find("PodDisruptionBudget")
	for _, d := range deps {
		var mine []*policyv1.PodDisruptionBudget
		for _, doc := range pdbs {
			p := doc.Obj.(*policyv1.PodDisruptionBudget)
			sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
			if err != nil || p.Spec.Selector == nil || sel.Empty() {
				c.errorf("PodDisruptionBudget %s: an empty or bad selector (%v)", p.Name, err)
				continue
			}
			if sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				mine = append(mine, p)
			}
		}
		if len(mine) != 1 {
			c.errorf("%s: %d PodDisruptionBudgets select its pods, want 1", d.Name, len(mine))
			continue
		}
		p := mine[0]
		for _, o := range deps {
			sel, _ := metav1.LabelSelectorAsSelector(p.Spec.Selector)
			if o != d && sel.Matches(labels.Set(o.Spec.Template.Labels)) {
				c.errorf("PodDisruptionBudget %s selects the pods of %s and of %s", p.Name, d.Name, o.Name)
			}
		}
		switch s := p.Spec; {
		case s.MaxUnavailable != nil && s.MinAvailable == nil:
			if s.MaxUnavailable.IntValue() != 1 {
				c.errorf("PodDisruptionBudget %s: maxUnavailable %s, want 1", p.Name, s.MaxUnavailable.String())
			}
		case s.MinAvailable != nil && s.MaxUnavailable == nil:
			if m := s.MinAvailable.IntValue(); m < 1 || m >= int(*d.Spec.Replicas) {
				c.errorf("PodDisruptionBudget %s: minAvailable %d must be 1..replicas-1", p.Name, m)
			}
		default:
			c.errorf("PodDisruptionBudget %s: set one of minAvailable and maxUnavailable", p.Name)
		}
	}
}

// dapr: the sidecar annotations (app id, no app port, a Configuration that
// exists, known annotation names).
func (c *checker) dapr(d *appsv1.Deployment, appID string) {
	a := d.Spec.Template.Annotations
	for k := range a {
		if strings.HasPrefix(k, "dapr.io/") && !daprAnnotations[k] {
			c.errorf("%s: annotation %s is not one of Dapr 1.14's sidecar annotations", d.Name, k)
		}
	}
	if a["dapr.io/enabled"] != "true" {
		c.errorf("%s: dapr.io/enabled must be \"true\"", d.Name)
	}
	if a["dapr.io/app-id"] != appID {
		c.errorf("%s: dapr.io/app-id %q, want %q", d.Name, a["dapr.io/app-id"], appID)
	}
	if _, ok := a["dapr.io/app-port"]; ok {
		c.errorf("%s: dapr.io/app-port set, but it serves no app channel (streaming subscriptions only)", d.Name)
	}
	if cfg := a["dapr.io/config"]; cfg == "" || c.b.Get("Configuration", cfg) == nil {
		c.errorf("%s: dapr.io/config %q names no Configuration of the build", d.Name, cfg)
	}
	if img := a["dapr.io/sidecar-image"]; img != "" && !strings.Contains(img[strings.LastIndex(img, "/")+1:], ":") {
		c.errorf("%s: dapr.io/sidecar-image %q has no tag", d.Name, img)
	}
	if s := a["dapr.io/api-token-secret"]; s != "" {
		c.secretKey(d.Name+": dapr.io/api-token-secret", s, "token")
	}
}

// service: the API's Service selects the API's pods only and reaches its
// gRPC and health ports by name.
func (c *checker) service(api, node *appsv1.Deployment, ac *corev1.Container) {
	svc, _ := c.b.Get("Service", apiDeployment).(*corev1.Service)
	if svc == nil {
		c.errorf("no Service %s", apiDeployment)
		return
	}
	sel := labels.SelectorFromSet(svc.Spec.Selector)
	if len(svc.Spec.Selector) == 0 || !sel.Matches(labels.Set(api.Spec.Template.Labels)) || sel.Matches(labels.Set(node.Spec.Template.Labels)) {
		c.errorf("Service %s must select the API's pods and no others", svc.Name)
	}
	names := map[string]bool{}
	for _, p := range svc.Spec.Ports {
		names[p.Name] = true
		if p.TargetPort.StrVal == "" {
			c.errorf("Service %s: port %s: target a named container port", svc.Name, p.Name)
		} else if _, ok := containerPort(ac, p.TargetPort.StrVal); !ok {
			c.errorf("Service %s: port %s targets %q, no port of the API container", svc.Name, p.Name, p.TargetPort.StrVal)
		}
	}
	if !names["grpc"] || !names["health"] {
		c.errorf("Service %s: ports grpc and health expected", svc.Name)
	}
}

// apiTokens: API_TOKENS_FILE is a key of a mounted Secret.
func (c *checker) apiTokens(api *appsv1.Deployment, ac *corev1.Container, env map[string]corev1.EnvVar) {
	path, _ := c.value(env, "API_TOKENS_FILE")
	if path == "" {
		return // tokens off: JWTs or client certificates must be configured
	}
	for _, m := range ac.VolumeMounts {
		if filepath.Dir(path) != filepath.Clean(m.MountPath) {
			continue
		}
		for _, v := range api.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.Secret != nil && len(v.Secret.Items) == 0 {
				c.secretKey("API_TOKENS_FILE", v.Secret.SecretName, filepath.Base(path))
				return
			}
		}
	}
	c.errorf("API_TOKENS_FILE %q is not a key of a Secret mounted at its directory", path)
}

// secretFile: the file a setting names (REDIS_CHECK_PASSWORD_FILE) is a
// key of a Secret mounted at its directory (all keys, or an item whose
// path is the file's name), when the setting is not empty.
func (c *checker) secretFile(who string, d *appsv1.Deployment, ct *corev1.Container, env map[string]corev1.EnvVar, name string) {
	path, _ := c.value(env, name)
	if path == "" {
		return
	}
	for _, m := range ct.VolumeMounts {
		if filepath.Dir(path) != filepath.Clean(m.MountPath) {
			continue
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name != m.Name || v.Secret == nil {
				continue
			}
			if len(v.Secret.Items) == 0 {
				c.secretKey(who+": "+name, v.Secret.SecretName, filepath.Base(path))
				return
			}
			for _, it := range v.Secret.Items {
				if it.Path == filepath.Base(path) {
					c.secretKey(who+": "+name, v.Secret.SecretName, it.Key)
					return
				}
			}
		}
	}
	c.errorf("%s: %s %q is not a key of a Secret mounted at its directory", who, name, path)
}

// security: the sandbox mode the node asks for is one its container can
// give. SANDBOX=strict refuses to start without every layer, which needs
// bubblewrap as real root in a privileged container (engines/sandbox,
// docs/scaling.md); and a privileged node must not run native code in
// process.
func (c *checker) security(node *appsv1.Deployment, nc *corev1.Container, env map[string]corev1.EnvVar) {
	sc := nc.SecurityContext
	privileged := sc != nil && sc.Privileged != nil && *sc.Privileged
	root := sc != nil && sc.RunAsUser != nil && *sc.RunAsUser == 0
	mode, _ := c.value(env, "SANDBOX")
	if mode == "strict" && !(privileged && root) {
		c.errorf("node: SANDBOX=strict needs a privileged container running as user 0, or it does not start")
	}
	if privileged {
		if iso, _ := c.value(env, "NATIVE_ISOLATION"); iso != "always" && iso != "process" {
			c.errorf("node: a privileged node must set NATIVE_ISOLATION=always (in-process native code runs as its root), got %q", iso)
		}
	}
	if mode == "off" {
		c.errorf("node: SANDBOX=off runs worker code unconfined")
	}
}

// components: the state store and the pub/sub the settings name, with the
// dev manifests' metadata (deploy/dapr/components) where they are Redis,
// and what WorkManager relies on where it is Kafka.
func (c *checker) components(pubsubType string, nodeEnv map[string]corev1.EnvVar, appIDs ...string) {
	byName := map[string]*DaprComponent{}
	for _, d := range c.b.Find("Component") {
		comp := d.Obj.(*DaprComponent)
		if byName[comp.Metadata.Name] != nil {
			c.errorf("two Components named %s", comp.Metadata.Name)
		}
		byName[comp.Metadata.Name] = comp
		for _, m := range comp.Spec.Metadata {
			n := 0
			if m.Value != nil {
				n++
			}
			if m.SecretKeyRef != nil {
				n++
				c.secretKey("Component "+comp.Metadata.Name+" "+m.Name, m.SecretKeyRef.Name, m.SecretKeyRef.Key)
			}
			if m.EnvRef != "" {
				n++
			}
			if n != 1 {
				c.errorf("Component %s: metadata %s needs exactly one of value, secretKeyRef, envRef", comp.Metadata.Name, m.Name)
			}
		}
		for _, id := range appIDs {
			if len(comp.Scopes) > 0 && !slices.Contains(comp.Scopes, id) {
				c.errorf("Component %s: scopes leave out app id %s", comp.Metadata.Name, id)
			}
		}
	}
	storeName, _ := c.value(nodeEnv, "DAPR_STATESTORE")
	pubsubName, _ := c.value(nodeEnv, "DAPR_PUBSUB")
	if len(byName) != 2 {
		c.errorf("%d Components, want 2 (%s and %s)", len(byName), storeName, pubsubName)
	}
	store := byName[storeName]
	if store == nil {
		c.errorf("no Component %q (DAPR_STATESTORE)", storeName)
	} else {
		if store.Spec.Type != "state.redis" {
			c.errorf("Component %s: type %s, want state.redis", storeName, store.Spec.Type)
		}
		c.mirrors(store, "statestore.yaml")
		// The nodes' and the API's check of the state store's Redis asks
		// the Redis the state store uses, not another (the broker's).
		if addr, _ := c.value(nodeEnv, "REDIS_CHECK_ADDR"); addr != "" {
			if h, ok := store.Meta("redisHost"); ok && h.Value != nil && *h.Value != addr {
				c.errorf("REDIS_CHECK_ADDR %q is not the state store's redisHost %q: the check would ask another Redis (set both in your overlay)", addr, *h.Value)
			}
		}
	}
	ps := byName[pubsubName]
	if ps == nil {
		c.errorf("no Component %q (DAPR_PUBSUB)", pubsubName)
		return
	}
	if ps.Spec.Type != pubsubType {
		c.errorf("Component %s: type %s, want %s", pubsubName, ps.Spec.Type, pubsubType)
	}
	meta := func(name string) string {
		m, ok := ps.Meta(name)
		if !ok || m.Value == nil {
			c.errorf("Component %s: no metadata %s", pubsubName, name)
			return ""
		}
		return *m.Value
	}
	switch ps.Spec.Type {
	case "pubsub.redis":
		c.mirrors(ps, "pubsub.yaml")
		// docs/architecture.md, "Broker processing timeout": a delivery
		// lasts at most the queue wait + WORKER_TIMEOUT + the group lock's
		// retries; the broker must not hand it out again meanwhile.
		pt, err := time.ParseDuration(meta("processingTimeout"))
		if err != nil {
			c.errorf("Component %s: processingTimeout: %v", pubsubName, err)
		}
		lock := time.Duration(c.integer(nodeEnv, "GROUP_LOCK_RETRY_BASE_DELAY_MS")) * time.Millisecond * time.Duration(1<<c.integer(nodeEnv, "GROUP_LOCK_MAX_RETRIES")-1)
		if most := c.duration(nodeEnv, "WORKER_QUEUE_WAIT") + c.duration(nodeEnv, "WORKER_TIMEOUT") + lock; pt <= most {
			c.errorf("Component %s: processingTimeout %s must exceed the longest delivery, %s", pubsubName, pt, most)
		}
		// Every stream capped, above what may stay unacknowledged (streamcap_test.go).
		c.streamCap(ps, pt, nodeEnv)
		// A RETRY comes back after retryDelay, below processingTimeout (retrydelay_test.go).
		rd, ok := ps.Meta("retryDelay")
		value := ""
		if ok && rd.Value != nil {
			value = *rd.Value
		}
		for _, p := range retryDelayProblems(value, ok, pt) {
			c.errorf("Component %s: %s", pubsubName, p)
		}
	case "pubsub.kafka":
		// One consumer group for every node (each message to one node),
		// and retries of what a node answered RETRY.
		if g := meta("consumerGroup"); g != nodeAppID {
			c.errorf("Component %s: consumerGroup %q, want the nodes' app id %q", pubsubName, g, nodeAppID)
		}
		if meta("consumeRetryEnabled") != "true" {
			c.errorf("Component %s: consumeRetryEnabled must be \"true\", or a message answered RETRY never runs again", pubsubName)
		}
		meta("brokers")
		meta("authType")
	}
}

// redisExtras are the metadata a cluster's Redis components may add to the
// dev manifests': credentials, TLS and Sentinel failover (Dapr's state.redis
// and pubsub.redis documentation). Nothing that changes keys, ETags or
// delivery.
var redisExtras = map[string]bool{"redisPassword": true, "redisUsername": true, "enableTLS": true, "failover": true, "sentinelMasterName": true}

// mirrors: a Redis component carries the dev manifest's metadata
// (deploy/dapr/components/<file>) unchanged but for redisHost, plus
// redisExtras.
func (c *checker) mirrors(comp *DaprComponent, file string) {
	docs, err := LoadFile(filepath.Join(repo, "deploy", "dapr", "components"), file)
	if err != nil {
		c.errorf("%v", err)
		return
	}
	dev := docs[0].Obj.(*DaprComponent)
	if dev.Spec.Type != comp.Spec.Type || dev.Spec.Version != comp.Spec.Version || dev.Metadata.Name != comp.Metadata.Name {
		c.errorf("Component %s: %s %s %s, the dev manifest %s has %s %s %s", comp.Metadata.Name, comp.Metadata.Name, comp.Spec.Type, comp.Spec.Version,
			file, dev.Metadata.Name, dev.Spec.Type, dev.Spec.Version)
	}
	for _, m := range dev.Spec.Metadata {
		got, ok := comp.Meta(m.Name)
		switch {
		case !ok:
			c.errorf("Component %s: lacks metadata %s of deploy/dapr/components/%s", comp.Metadata.Name, m.Name, file)
		case m.Name == "redisHost":
		case m.Name == "processingTimeout" && file == "pubsub.yaml":
			// The cluster's covers a full worker queue, the dev stack's
			// does not need to (checked in components and
			// TestQueuedMessagesAreNotRedelivered).
		case !reflect.DeepEqual(got.Value, m.Value):
			c.errorf("Component %s: metadata %s differs from deploy/dapr/components/%s", comp.Metadata.Name, m.Name, file)
		}
	}
	for _, m := range comp.Spec.Metadata {
		if _, ok := dev.Meta(m.Name); !ok && !redisExtras[m.Name] {
			c.errorf("Component %s: metadata %s is not in deploy/dapr/components/%s", comp.Metadata.Name, m.Name, file)
		}
	}
}

// namespace: the build's one Namespace is where every resource and the
// Secrets go (kustomize puts a resource without one in kubectl's current
// namespace), and it admits the pods' privileges.
func (c *checker) namespace() {
	nss := c.b.Find("Namespace")
	if len(nss) != 1 {
		c.errorf("want one Namespace, got %d", len(nss))
		return
	}
	ns := nss[0].Obj.(*corev1.Namespace)
	for i, d := range c.b.Docs {
		if !clusterScoped(d.Kind) && c.b.Namespaces[i] != ns.Name {
			c.errorf("%s: deployed to namespace %q, not %q (set namespace in the kustomization)", d, c.b.Namespaces[i], ns.Name)
		}
	}
	privileged := false
	for _, d := range c.b.Find("Deployment") {
		for _, ct := range d.Obj.(*appsv1.Deployment).Spec.Template.Spec.Containers {
			if sc := ct.SecurityContext; sc != nil && sc.Privileged != nil && *sc.Privileged {
				privileged = true
			}
		}
	}
	if enforce := ns.Labels["pod-security.kubernetes.io/enforce"]; privileged && enforce != "privileged" {
		c.errorf("Namespace %s: a privileged pod needs pod-security.kubernetes.io/enforce=privileged, got %q", ns.Name, enforce)
	} else if !privileged && enforce == "privileged" {
		c.errorf("Namespace %s: no privileged pod, so enforce a stricter Pod Security level than privileged", ns.Name)
	}
	docs, err := LoadFile(root, secretsExample)
	if err != nil {
		c.errorf("%v", err)
		return
	}
	for _, d := range docs {
		if s := d.Obj.(*corev1.Secret); s.Namespace != ns.Name {
			c.errorf("%s: Secret %s in namespace %q, the manifests deploy to %q", secretsExample, s.Name, s.Namespace, ns.Name)
		}
	}
}

// onePerHost: the node pods never share a host (a required pod
// anti-affinity on the hostname that selects them): sandbox user ids are
// unique among the node processes of a host only when they share
// /run/workmanager/sandbox-uids, and each container has a /run of its own
// (docs/security.md, "User ids and containers").
func (c *checker) onePerHost(d *appsv1.Deployment) {
	a := d.Spec.Template.Spec.Affinity
	if a != nil && a.PodAntiAffinity != nil {
		for _, term := range a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
			sel, err := metav1.LabelSelectorAsSelector(term.LabelSelector)
			if err == nil && term.TopologyKey == "kubernetes.io/hostname" && sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				return
			}
		}
	}
	c.errorf("%s: its pods may share a host (no required pod anti-affinity on kubernetes.io/hostname selecting them): two node containers on one host can give one sandbox user id to two tenants' workers", d.Name)
}
