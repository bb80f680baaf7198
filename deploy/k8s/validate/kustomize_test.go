package validate

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// TestKustomizeAgrees builds each variant with kubectl's kustomize, when
// kubectl is installed (it is not required: the other tests stand alone),
// and checks that it yields the same objects as this test's reading of the
// kustomizations, each decoded strictly, in the namespaces expected.
func TestKustomizeAgrees(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not installed")
	}
	for dir := range builds {
		t.Run(dir, func(t *testing.T) {
			out, err := exec.Command(kubectl, "kustomize", filepath.Join(root, dir)).Output()
			if err != nil {
				t.Fatalf("kubectl kustomize %s: %v", dir, err)
			}
			b, err := LoadBuild(root, dir)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for i, raw := range SplitDocs(out) {
				d, err := Decode("kustomize "+dir, i, raw)
				if err != nil {
					t.Fatal(err)
				}
				ns := objectNamespace(d.Obj)
				normalize(d.Obj)
				j, _ := json.Marshal(d.Obj)
				got[d.Kind+"/"+d.Name] = ns + " " + string(j)
			}
			if len(got) != len(b.Docs) {
				t.Errorf("kustomize builds %d objects, this test reads %d", len(got), len(b.Docs))
			}
			for i, d := range b.Docs {
				normalize(d.Obj)
				j, _ := json.Marshal(d.Obj)
				if want := b.Namespaces[i] + " " + string(j); got[d.Kind+"/"+d.Name] != want {
					t.Errorf("%s differs:\nkustomize: %s\nthis test: %s", d, got[d.Kind+"/"+d.Name], want)
				}
			}
		})
	}
}

// normalize clears the namespace (compared apart) and sorts containers'
// variables by name: kustomize's strategic merge puts a patched variable
// first, apimachinery's keeps its place; the order carries no meaning here
// (no $(VAR) references).
func normalize(obj any) {
	if d, ok := obj.(*appsv1.Deployment); ok {
		for i := range d.Spec.Template.Spec.Containers {
			env := d.Spec.Template.Spec.Containers[i].Env
			sort.SliceStable(env, func(a, b int) bool { return env[a].Name < env[b].Name })
		}
	}
	switch o := obj.(type) {
	case interface{ SetNamespace(string) }:
		o.SetNamespace("")
	case *DaprComponent:
		o.Metadata.Namespace = ""
	case *DaprConfiguration:
		o.Metadata.Namespace = ""
	}
}
