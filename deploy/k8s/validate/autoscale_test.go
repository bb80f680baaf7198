package validate

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	policyv1 "k8s.io/api/policy/v1"
)

// autoscaleFacts are what the autoscaling examples must agree with, read
// from the default build and the sources.
type autoscaleFacts struct {
	namespace         string
	node              *appsv1.Deployment
	appID             string // the node pods' dapr.io/app-id: daprd's consumer group
	redisHost         string // the pub/sub component's redisHost
	username, passwd  secretRef
	placementReplicas int // PLACEMENT_REPLICAS (0: "all")
	maxUnavailable    int // the node PodDisruptionBudget's
	secrets           map[string]map[string]bool
}

type secretRef struct{ name, key string }

func readAutoscaleFacts(t *testing.T) autoscaleFacts {
	t.Helper()
	b, err := LoadBuild(root, ".")
	if err != nil {
		t.Fatal(err)
	}
	f := autoscaleFacts{secrets: exampleSecrets(t)}
	for i, d := range b.Docs {
		if d.Kind == "Deployment" && d.Name == nodeDeployment {
			f.node, f.namespace = d.Obj.(*appsv1.Deployment), b.Namespaces[i]
		}
	}
	if f.node == nil {
		t.Fatalf("no Deployment %s in the default build", nodeDeployment)
	}
	f.appID = f.node.Spec.Template.Annotations["dapr.io/app-id"]
	// devstack.AppID: the app id the dev stack and the tests give the
	// nodes' daprd, so the consumer group of every stream.
	src, err := os.ReadFile(filepath.Join(repo, "internal", "devstack", "devstack.go"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^const AppID = "([^"]+)"`).FindSubmatch(src)
	if m == nil {
		t.Fatal("internal/devstack/devstack.go: no `const AppID = \"…\"`")
	}
	if f.appID != string(m[1]) || f.appID != nodeAppID {
		t.Fatalf("the node pods' dapr.io/app-id %q, devstack.AppID %q: they must agree", f.appID, m[1])
	}
	pubsub, ok := b.Get("Component", "pubsub").(*DaprComponent)
	if !ok {
		t.Fatal("no pub/sub component pubsub in the default build")
	}
	host, _ := pubsub.Meta("redisHost")
	user, _ := pubsub.Meta("redisUsername")
	pass, _ := pubsub.Meta("redisPassword")
	if host.Value == nil || user.SecretKeyRef == nil || pass.SecretKeyRef == nil {
		t.Fatal("the pub/sub component lacks redisHost or the secretKeyRefs of redisUsername and redisPassword")
	}
	f.redisHost = *host.Value
	f.username = secretRef{user.SecretKeyRef.Name, user.SecretKeyRef.Key}
	f.passwd = secretRef{pass.SecretKeyRef.Name, pass.SecretKeyRef.Key}
	for _, c := range f.node.Spec.Template.Spec.Containers {
		for _, e := range c.Env {
			if c.Name == nodeContainer && e.Name == "PLACEMENT_REPLICAS" && e.Value != "all" {
				if f.placementReplicas, err = strconv.Atoi(e.Value); err != nil {
					t.Fatalf("PLACEMENT_REPLICAS %q", e.Value)
				}
			}
		}
	}
	for _, d := range b.Find("PodDisruptionBudget") {
		if pdb := d.Obj.(*policyv1.PodDisruptionBudget); d.Name == nodeDeployment && pdb.Spec.MaxUnavailable != nil {
			f.maxUnavailable = pdb.Spec.MaxUnavailable.IntValue()
		}
	}
	if f.maxUnavailable < 1 {
		t.Fatalf("the node PodDisruptionBudget %s has no maxUnavailable of at least 1", nodeDeployment)
	}
	return f
}

// minReplicas is the least a scaler may leave: a drain (the PDB's room)
// must still leave PLACEMENT_REPLICAS nodes, and never fewer than 2.
func (f autoscaleFacts) minReplicas() int {
	return max(2, f.placementReplicas+f.maxUnavailable, 1+f.maxUnavailable)
}

// checkKEDA lists what is wrong with the KEDA example's documents.
func checkKEDA(f autoscaleFacts, docs []Doc, namespaces []string) []string {
	var bad []string
	auths := map[string]*KEDATriggerAuthentication{}
	var objs []*KEDAScaledObject
	for i, d := range docs {
		if d.Kind != "Kustomization" && namespaces[i] != f.namespace {
			bad = append(bad, fmt.Sprintf("%s: namespace %q, the node Deployment's is %q", d, namespaces[i], f.namespace))
		}
		switch o := d.Obj.(type) {
		case *KEDAScaledObject:
			objs = append(objs, o)
		case *KEDATriggerAuthentication:
			auths[d.Name] = o
		}
	}
	if len(objs) != 1 {
		return append(bad, fmt.Sprintf("want one ScaledObject, found %d", len(objs)))
	}
	so := objs[0]
	ref := so.Spec.ScaleTargetRef
	if ref.Name != f.node.Name || (ref.Kind != "" && ref.Kind != "Deployment") || (ref.APIVersion != "" && ref.APIVersion != "apps/v1") {
		bad = append(bad, fmt.Sprintf("scaleTargetRef %s %s %s: want the node Deployment %s", ref.APIVersion, ref.Kind, ref.Name, f.node.Name))
	}
	min, max := so.Spec.MinReplicaCount, so.Spec.MaxReplicaCount
	switch {
	case min == nil || int(*min) < f.minReplicas():
		bad = append(bad, fmt.Sprintf("minReplicaCount must be at least %d (2, and PLACEMENT_REPLICAS %d plus the PodDisruptionBudget's maxUnavailable %d): KEDA's default 0 scales the nodes away",
			f.minReplicas(), f.placementReplicas, f.maxUnavailable))
	case max == nil || *max < *min:
		bad = append(bad, "maxReplicaCount must be set, at least minReplicaCount")
	}
	if len(so.Spec.Triggers) == 0 {
		bad = append(bad, "no trigger")
	}
	for i, tr := range so.Spec.Triggers {
		at := fmt.Sprintf("trigger %d", i)
		if tr.Type != "redis-streams" {
			bad = append(bad, fmt.Sprintf("%s: type %q, want redis-streams", at, tr.Type))
			continue
		}
		md := tr.Metadata
		for k := range md {
			switch k {
			case "address", "stream", "consumerGroup", "lagCount", "pendingEntriesCount", "activationLagCount", "enableTLS", "databaseIndex":
			default:
				bad = append(bad, fmt.Sprintf("%s: metadata %q is not one this check knows", at, k))
			}
		}
		if md["address"] != f.redisHost {
			bad = append(bad, fmt.Sprintf("%s: address %q, the pub/sub component's redisHost is %q", at, md["address"], f.redisHost))
		}
		if md["consumerGroup"] != f.appID {
			bad = append(bad, fmt.Sprintf("%s: consumerGroup %q, the nodes' consumer group is their Dapr app id %q", at, md["consumerGroup"], f.appID))
		}
		if strings.TrimSpace(md["stream"]) == "" {
			bad = append(bad, at+": no stream (a topic's name)")
		}
		lag, pending := md["lagCount"], md["pendingEntriesCount"]
		if (lag == "") == (pending == "") {
			bad = append(bad, at+": set lagCount (Redis 7) or pendingEntriesCount, one of them")
		}
		for _, v := range []string{lag, pending} {
			if n, err := strconv.Atoi(v); v != "" && (err != nil || n < 1) {
				bad = append(bad, fmt.Sprintf("%s: %q is not a positive count", at, v))
			}
		}
		if tr.AuthenticationRef == nil || auths[tr.AuthenticationRef.Name] == nil {
			bad = append(bad, at+": authenticationRef must name the example's TriggerAuthentication")
			continue
		}
		got := map[string]secretRef{}
		for _, s := range auths[tr.AuthenticationRef.Name].Spec.SecretTargetRef {
			got[s.Parameter] = secretRef{s.Name, s.Key}
			if !f.secrets[s.Name][s.Key] {
				bad = append(bad, fmt.Sprintf("%s: Secret %s key %s is not in %s", at, s.Name, s.Key, secretsExample))
			}
		}
		if got["username"] != f.username || got["password"] != f.passwd || len(got) != 2 {
			bad = append(bad, fmt.Sprintf("%s: credentials %v, want the pub/sub component's: username %v, password %v", at, got, f.username, f.passwd))
		}
	}
	return bad
}

// checkHPA lists what is wrong with the HPA example.
func checkHPA(f autoscaleFacts, docs []Doc, namespaces []string) []string {
	var bad []string
	var hpas []*autoscalingv2.HorizontalPodAutoscaler
	for i, d := range docs {
		if d.Kind != "Kustomization" && namespaces[i] != f.namespace {
			bad = append(bad, fmt.Sprintf("%s: namespace %q, the node Deployment's is %q", d, namespaces[i], f.namespace))
		}
		if h, ok := d.Obj.(*autoscalingv2.HorizontalPodAutoscaler); ok {
			hpas = append(hpas, h)
		}
	}
	if len(hpas) != 1 {
		return append(bad, fmt.Sprintf("want one HorizontalPodAutoscaler, found %d", len(hpas)))
	}
	h := hpas[0]
	if ref := h.Spec.ScaleTargetRef; ref.Name != f.node.Name || ref.Kind != "Deployment" || ref.APIVersion != "apps/v1" {
		bad = append(bad, fmt.Sprintf("scaleTargetRef %s %s %s: want the node Deployment %s", ref.APIVersion, ref.Kind, ref.Name, f.node.Name))
	}
	if h.Spec.MinReplicas == nil || int(*h.Spec.MinReplicas) < f.minReplicas() || h.Spec.MaxReplicas < *h.Spec.MinReplicas {
		bad = append(bad, fmt.Sprintf("minReplicas must be at least %d and maxReplicas at least that", f.minReplicas()))
	}
	for _, m := range h.Spec.Metrics {
		if m.Type == autoscalingv2.ResourceMetricSourceType && m.Resource != nil && m.Resource.Target.Type == autoscalingv2.UtilizationMetricType {
			for _, c := range f.node.Spec.Template.Spec.Containers {
				if _, ok := c.Resources.Requests[m.Resource.Name]; c.Name == nodeContainer && !ok {
					bad = append(bad, fmt.Sprintf("a %s utilization target needs the node container's %s request", m.Resource.Name, m.Resource.Name))
				}
			}
		}
	}
	return bad
}

// The optional autoscaling examples decode strictly and scale the real
// node Deployment, in its namespace, on the lag of the nodes' real
// consumer group on the pub/sub's real Redis, with its credentials, and
// never below what a drain and placement need; a broken copy is caught.
func TestAutoscalingExamples(t *testing.T) {
	f := readAutoscaleFacts(t)
	load := func(dir string) *Build {
		t.Helper()
		b, err := LoadBuild(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	keda, hpa := load("optional/keda"), load("optional/hpa")
	for _, p := range checkKEDA(f, keda.Docs, keda.Namespaces) {
		t.Errorf("optional/keda: %s", p)
	}
	for _, p := range checkHPA(f, hpa.Docs, hpa.Namespaces) {
		t.Errorf("optional/hpa: %s", p)
	}

	// The checks catch a wrong copy.
	broken := load("optional/keda")
	for _, d := range broken.Docs {
		if so, ok := d.Obj.(*KEDAScaledObject); ok {
			one := int32(1)
			so.Spec.MinReplicaCount = &one
			so.Spec.ScaleTargetRef.Name = "workmanager"
			so.Spec.Triggers[0].Metadata["consumerGroup"] = "workmanager-node"
			so.Spec.Triggers[0].Metadata["address"] = "redis:6379"
		}
	}
	got := strings.Join(checkKEDA(f, broken.Docs, broken.Namespaces), "\n")
	for _, want := range []string{"minReplicaCount", "scaleTargetRef", "consumerGroup", "address"} {
		if !strings.Contains(got, want) {
			t.Errorf("a ScaledObject with a wrong %s passed: %s", want, got)
		}
	}

	// kubectl's kustomize builds them, when installed.
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		return
	}
	for dir := range optionalExamples {
		out, err := exec.Command(kubectl, "kustomize", filepath.Join(root, dir)).Output()
		if err != nil {
			t.Fatalf("kubectl kustomize %s: %v", dir, err)
		}
		n := 0
		for i, raw := range SplitDocs(out) {
			d, err := Decode("kustomize "+dir, i, raw)
			if err != nil {
				t.Fatal(err)
			}
			if ns := objectNamespace(d.Obj); ns != f.namespace {
				t.Errorf("kustomize %s: %s in namespace %q, want %q", dir, d, ns, f.namespace)
			}
			n++
		}
		if b := load(dir); n != len(b.Docs) {
			t.Errorf("kustomize %s builds %d objects, this test reads %d", dir, n, len(b.Docs))
		}
	}
}
