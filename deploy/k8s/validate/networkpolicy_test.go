package validate

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// endpoint is something the node's pod must reach: a port in a namespace
// (a Kubernetes service address "<svc>.<namespace>[.svc…]:<port>").
type endpoint struct {
	what, namespace string
	port            int32
	protocol        corev1.Protocol
}

func (e endpoint) String() string {
	return fmt.Sprintf("%s (%s/%d in namespace %s)", e.what, e.protocol, e.port, e.namespace)
}

// serviceEndpoint reads "<svc>.<namespace>…:<port>" (an address of the
// manifests) into what must be reachable.
func serviceEndpoint(what, addr string) (endpoint, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return endpoint{}, fmt.Errorf("%s %q: %v", what, addr, err)
	}
	parts := strings.Split(host, ".")
	p, err := strconv.Atoi(port)
	if len(parts) < 2 || err != nil {
		return endpoint{}, fmt.Errorf("%s %q is not <service>.<namespace>:<port>", what, addr)
	}
	return endpoint{what: what, namespace: parts[1], port: int32(p), protocol: corev1.ProtocolTCP}, nil
}

// privateRanges must be excepted from every ipBlock of the node's egress:
// the cluster's own addresses and the cloud's metadata service.
var privateRanges = []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "127.0.0.0/8"}

// mayOnlyReach are ports that reach a Dapr API or sidecar: a rule that
// allows one may do so only into the namespace given ("" nowhere). daprd's
// HTTP and gRPC APIs (3500, 50001) are the pod's own, on loopback; 50001 is
// also sentry's port in dapr-system.
var mayOnlyReach = map[int32]string{3500: "", 50001: "dapr-system", 3501: ""}

// checkNodePolicy checks the NetworkPolicies of a build against the node's
// pods (podLabels): at least one isolates them for ingress and egress,
// together they let the pods reach every one of needs, and no rule opens
// more than a port or a namespace at a time: no rule without ports, none
// to anywhere, an all-namespaces peer only for Dapr's invocation port
// 50002, ipBlocks only with the private ranges excepted, and daprd's API
// ports never. It returns what is wrong.
func checkNodePolicy(policies []*networkingv1.NetworkPolicy, podLabels map[string]string, needs []endpoint) []string {
	var problems []string
	var selecting []*networkingv1.NetworkPolicy
	isolatedIn, isolatedOut := false, false
	for _, p := range policies {
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		if err != nil {
			problems = append(problems, fmt.Sprintf("NetworkPolicy %s: bad podSelector: %v", p.Name, err))
			continue
		}
		if sel.Empty() {
			problems = append(problems, fmt.Sprintf("NetworkPolicy %s: selects every pod of the namespace; select the node's", p.Name))
		}
		if !sel.Matches(labels.Set(podLabels)) {
			continue
		}
		selecting = append(selecting, p)
		for _, t := range p.Spec.PolicyTypes {
			isolatedIn = isolatedIn || t == networkingv1.PolicyTypeIngress
			isolatedOut = isolatedOut || t == networkingv1.PolicyTypeEgress
		}
		for i, r := range p.Spec.Ingress {
			if len(r.Ports) == 0 {
				problems = append(problems, fmt.Sprintf("NetworkPolicy %s ingress rule %d: no ports (every port)", p.Name, i))
			}
		}
		for i, r := range p.Spec.Egress {
			where := fmt.Sprintf("NetworkPolicy %s egress rule %d", p.Name, i)
			if len(r.Ports) == 0 {
				problems = append(problems, where+": no ports (every port)")
			}
			if len(r.To) == 0 {
				problems = append(problems, where+": no \"to\" (anywhere)")
			}
			for _, peer := range r.To {
				switch {
				case peer.IPBlock != nil:
					for _, want := range privateRanges {
						if !excepted(peer.IPBlock, want) {
							problems = append(problems, fmt.Sprintf("%s: ipBlock %s does not except %s", where, peer.IPBlock.CIDR, want))
						}
					}
				case peer.NamespaceSelector != nil && len(peer.NamespaceSelector.MatchLabels) == 0 && len(peer.NamespaceSelector.MatchExpressions) == 0:
					for _, port := range r.Ports {
						if port.Port == nil || port.Port.IntValue() != 50002 {
							problems = append(problems, fmt.Sprintf("%s: every namespace is open on %v; only Dapr's invocation port 50002 may be", where, port.Port))
						}
					}
				case peer.NamespaceSelector == nil:
					problems = append(problems, where+": a peer without namespaceSelector (the policy's own namespace: the API's daprd)")
				}
				for _, port := range r.Ports {
					if port.Port == nil {
						continue
					}
					ns, listed := mayOnlyReach[int32(port.Port.IntValue())]
					if listed && (ns == "" || peerNamespace(peer) != ns) {
						problems = append(problems, fmt.Sprintf("%s: port %d reaches a Dapr API (only the pod's own, on loopback)", where, port.Port.IntValue()))
					}
				}
			}
		}
	}
	if len(selecting) == 0 {
		return append(problems, fmt.Sprintf("no NetworkPolicy selects the node's pods (%v)", podLabels))
	}
	if !isolatedIn || !isolatedOut {
		problems = append(problems, fmt.Sprintf("the node's pods are isolated for ingress %v and egress %v; want both", isolatedIn, isolatedOut))
	}
	for _, n := range needs {
		if !allows(selecting, n) {
			problems = append(problems, "the node's pods cannot reach "+n.String())
		}
	}
	return problems
}

func excepted(b *networkingv1.IPBlock, cidr string) bool {
	want := netip.MustParsePrefix(cidr)
	for _, e := range b.Except {
		if p, err := netip.ParsePrefix(e); err == nil && p.Bits() <= want.Bits() && p.Contains(want.Addr()) {
			return true
		}
	}
	if p, err := netip.ParsePrefix(b.CIDR); err == nil && !p.Overlaps(want) {
		return true
	}
	return false
}

// peerNamespace is the namespace a peer names by its
// kubernetes.io/metadata.name label ("" for any other peer).
func peerNamespace(p networkingv1.NetworkPolicyPeer) string {
	if p.NamespaceSelector == nil {
		return ""
	}
	return p.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"]
}

// allows says whether an egress rule of policies lets the pods reach n.
func allows(policies []*networkingv1.NetworkPolicy, n endpoint) bool {
	for _, p := range policies {
		for _, r := range p.Spec.Egress {
			portOK := false
			for _, port := range r.Ports {
				proto := corev1.ProtocolTCP
				if port.Protocol != nil {
					proto = *port.Protocol
				}
				if proto == n.protocol && port.Port != nil && int32(port.Port.IntValue()) == n.port {
					portOK = true
				}
			}
			if !portOK {
				continue
			}
			for _, peer := range r.To {
				if ns := peerNamespace(peer); ns == n.namespace {
					return true
				}
			}
		}
	}
	return false
}

// networkPolicy checks the build's NetworkPolicies against what the node
// needs: DNS, Temporal (TEMPORAL_ADDRESS), the state store's and the
// pub/sub's hosts (their Components), Dapr's sentry and operator, and the
// OTLP collector when OTEL_EXPORTER_OTLP_ENDPOINT is set.
func (c *checker) networkPolicy(node *appsv1.Deployment, nodeEnv map[string]corev1.EnvVar) {
	needs := []endpoint{
		{"DNS", "kube-system", 53, corev1.ProtocolUDP},
		{"DNS over TCP", "kube-system", 53, corev1.ProtocolTCP},
		{"Dapr sentry", "dapr-system", 50001, corev1.ProtocolTCP},
		{"Dapr operator", "dapr-system", 6500, corev1.ProtocolTCP},
	}
	add := func(what, addr string) {
		e, err := serviceEndpoint(what, addr)
		if err != nil {
			c.errorf("%v", err)
			return
		}
		needs = append(needs, e)
	}
	if v, ok := c.value(nodeEnv, "TEMPORAL_ADDRESS"); ok {
		add("Temporal (TEMPORAL_ADDRESS)", v)
	} else {
		c.errorf("node: no TEMPORAL_ADDRESS")
	}
	if v, ok := c.value(nodeEnv, "OTEL_EXPORTER_OTLP_ENDPOINT"); ok && v != "" {
		u, err := url.Parse(v)
		if err != nil {
			c.errorf("node: OTEL_EXPORTER_OTLP_ENDPOINT %q: %v", v, err)
		} else {
			add("the OTLP collector", u.Host)
		}
	}
	for _, d := range c.b.Find("Component") {
		comp := d.Obj.(*DaprComponent)
		for _, key := range []string{"redisHost", "brokers"} {
			if m, ok := comp.Meta(key); ok && m.Value != nil {
				for _, addr := range strings.Split(*m.Value, ",") {
					add("Component "+comp.Metadata.Name+" "+key, strings.TrimSpace(addr))
				}
			}
		}
	}
	var policies []*networkingv1.NetworkPolicy
	for _, d := range c.b.Find("NetworkPolicy") {
		policies = append(policies, d.Obj.(*networkingv1.NetworkPolicy))
	}
	for _, p := range checkNodePolicy(policies, node.Spec.Template.Labels, needs) {
		c.errorf("%s", p)
	}
}

// TestNodePolicyCheckRefusesOpenRules shows that checkNodePolicy catches a
// policy that opens too much or too little.
func TestNodePolicyCheckRefusesOpenRules(t *testing.T) {
	pod := map[string]string{"app": "node"}
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	port := func(p int, proto corev1.Protocol) networkingv1.NetworkPolicyPort {
		v := intstr.FromInt32(int32(p))
		return networkingv1.NetworkPolicyPort{Port: &v, Protocol: &proto}
	}
	ns := func(name string) networkingv1.NetworkPolicyPeer {
		return networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": name}}}
	}
	good := func() *networkingv1.NetworkPolicy {
		return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: pod},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{
				{To: []networkingv1.NetworkPolicyPeer{ns("kube-system")}, Ports: []networkingv1.NetworkPolicyPort{port(53, udp)}},
				{To: []networkingv1.NetworkPolicyPeer{ns("redis")}, Ports: []networkingv1.NetworkPolicyPort{port(6379, tcp)}},
			}}}
	}
	needs := []endpoint{{"DNS", "kube-system", 53, udp}, {"Redis", "redis", 6379, tcp}}
	if p := checkNodePolicy([]*networkingv1.NetworkPolicy{good()}, pod, needs); len(p) != 0 {
		t.Fatalf("a good policy: %v", p)
	}
	for name, c := range map[string]struct {
		change func(*networkingv1.NetworkPolicy)
		want   string
	}{
		"no ports":        {func(p *networkingv1.NetworkPolicy) { p.Spec.Egress[1].Ports = nil }, "no ports"},
		"anywhere":        {func(p *networkingv1.NetworkPolicy) { p.Spec.Egress[1].To = nil }, "anywhere"},
		"missing need":    {func(p *networkingv1.NetworkPolicy) { p.Spec.Egress = p.Spec.Egress[:1] }, "cannot reach Redis"},
		"not isolated":    {func(p *networkingv1.NetworkPolicy) { p.Spec.PolicyTypes = p.Spec.PolicyTypes[:1] }, "want both"},
		"other pods":      {func(p *networkingv1.NetworkPolicy) { p.Spec.PodSelector.MatchLabels = map[string]string{"app": "api"} }, "no NetworkPolicy selects"},
		"every namespace": {func(p *networkingv1.NetworkPolicy) { p.Spec.Egress[1].To[0].NamespaceSelector.MatchLabels = nil }, "every namespace is open"},
		"daprd HTTP API": {func(p *networkingv1.NetworkPolicy) {
			p.Spec.Egress[1].Ports = append(p.Spec.Egress[1].Ports, port(3500, tcp))
		}, "reaches a Dapr API"},
		"open internet": {func(p *networkingv1.NetworkPolicy) {
			p.Spec.Egress[1].To[0] = networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0"}}
		}, "does not except 169.254.0.0/16"},
		"ingress any port": {func(p *networkingv1.NetworkPolicy) { p.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{}} }, "ingress rule 0: no ports"},
	} {
		p := good()
		c.change(p)
		problems := checkNodePolicy([]*networkingv1.NetworkPolicy{p}, pod, needs)
		if !strings.Contains(strings.Join(problems, "\n"), c.want) {
			t.Errorf("%s: %q, want %q", name, problems, c.want)
		}
	}
}
