package validate

import (
	"path/filepath"
	"slices"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
)

// The example NetworkPolicy for Temporal's frontend (issue 46 item 5)
// decodes strictly and admits WorkManager's nodes and API on 7233.
func TestTemporalFrontendPolicyExample(t *testing.T) {
	docs, err := LoadFile(filepath.Join(repo, "deploy", "temporal"), "networkpolicy-frontend.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) != 1 {
		t.Fatalf("%d documents", len(docs))
	}
	p, ok := docs[0].Obj.(*networkingv1.NetworkPolicy)
	if !ok {
		t.Fatalf("%s is not a NetworkPolicy", docs[0])
	}
	var admitted bool
	for _, r := range p.Spec.Ingress {
		for _, from := range r.From {
			if from.NamespaceSelector == nil || from.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "workmanager" || from.PodSelector == nil {
				continue
			}
			for _, e := range from.PodSelector.MatchExpressions {
				if e.Key == "app.kubernetes.io/component" && slices.Contains(e.Values, "node") && slices.Contains(e.Values, "api") &&
					len(r.Ports) == 1 && r.Ports[0].Port.IntValue() == 7233 {
					admitted = true
				}
			}
		}
	}
	if !admitted {
		t.Fatalf("the policy does not admit WorkManager's nodes and API on 7233: %+v", p.Spec.Ingress)
	}
}
