package validate

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// guideDoc is the operator's guide whose steps TestOperatorGuide runs.
var guideDoc = filepath.Join(repo, "docs", "scaling.md")

// guideBlock is a fenced code block of the guide after a marker comment:
// <!-- k8s-guide:file PATH --> (a file the operator creates) or
// <!-- k8s-guide:commands --> (commands the operator runs).
var guideBlock = regexp.MustCompile("(?m)^([ \t]*)<!-- k8s-guide:(file|commands) ?([^ ]*) -->[ \t]*\n(?:[ \t]*\n)*([ \t]*)```[a-z]*\n((?s:.*?))\n[ \t]*```")

type guide struct {
	files    map[string]string // path (relative to the working directory) -> content
	commands []string
}

func readGuide(t *testing.T) guide {
	t.Helper()
	raw, err := os.ReadFile(guideDoc)
	if err != nil {
		t.Fatal(err)
	}
	g := guide{files: map[string]string{}}
	for _, m := range guideBlock.FindAllStringSubmatch(string(raw), -1) {
		indent := m[4]
		var lines []string
		for _, l := range strings.Split(m[5], "\n") {
			lines = append(lines, strings.TrimPrefix(l, indent))
		}
		body := strings.Join(lines, "\n") + "\n"
		switch m[2] {
		case "file":
			if m[3] == "" || filepath.IsAbs(m[3]) || strings.Contains(m[3], "..") {
				t.Fatalf("%s: k8s-guide:file %q: a relative path expected", guideDoc, m[3])
			}
			if _, dup := g.files[m[3]]; dup {
				t.Fatalf("%s: k8s-guide:file %s twice", guideDoc, m[3])
			}
			g.files[m[3]] = body
		case "commands":
			for _, l := range lines {
				if i := strings.Index(l, " #"); i >= 0 { // a shell comment
					l = l[:i]
				}
				if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
					g.commands = append(g.commands, l)
				}
			}
		}
	}
	if len(g.files) == 0 || len(g.commands) == 0 {
		t.Fatalf("%s: the operator's steps are not marked (<!-- k8s-guide:file PATH --> before each file the operator creates, <!-- k8s-guide:commands --> before the commands that build and apply them), so they cannot be run", guideDoc)
	}
	return g
}

// walkK8s calls f for every directory and file of deploy/k8s but the
// validator's own (p: the path, rel: relative to deploy/k8s).
func walkK8s(f func(p, rel string, d fs.DirEntry) error) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() && rel == "validate" {
			return filepath.SkipDir
		}
		return f(p, rel, d)
	})
}

// copyTree copies deploy/k8s (without the validator) to dst.
func copyTree(t *testing.T, dst string) {
	t.Helper()
	err := walkK8s(func(p, rel string, d fs.DirEntry) error {
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestOperatorGuide runs docs/scaling.md's "Deploying" steps 4 and 5 as
// written, up to kubectl apply: it writes the overlay the guide tells the
// operator to create next to a copy of this repository's deploy/k8s (the
// guide's layout: workmanager/ and my-workmanager/ side by side), runs the
// guide's `kubectl kustomize`, and holds the result to every check of the
// validation (TestBuilds, TestOperations) and to what the overlay exists
// for: the operator's images and addresses, with nothing else lost
// (keyPrefix: none).
func TestOperatorGuide(t *testing.T) {
	g := readGuide(t)
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not installed")
	}
	work := t.TempDir()
	copyTree(t, filepath.Join(work, "workmanager", "deploy", "k8s"))
	for p, body := range g.files {
		full := filepath.Join(work, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// The commands: one kustomize build of the overlay, and an apply of
	// what it built (or of the overlay), never of deploy/k8s itself.
	var overlay, built string
	applied := false
	for _, c := range g.commands {
		f := strings.Fields(c)
		if len(f) >= 3 && f[0] == "kubectl" && f[1] == "kustomize" {
			if overlay != "" {
				t.Fatalf("guide: two kubectl kustomize commands: %q", c)
			}
			overlay = f[2]
			if len(f) >= 5 && f[3] == ">" {
				built = f[4]
			}
		}
	}
	if overlay == "" {
		t.Fatalf("guide: no `kubectl kustomize <overlay>` among the commands %q", g.commands)
	}
	if _, ok := g.files[filepath.Join(overlay, "kustomization.yaml")]; !ok {
		t.Fatalf("guide: kubectl kustomize %s, but the guide creates no %s/kustomization.yaml", overlay, overlay)
	}
	for _, c := range g.commands {
		f := strings.Fields(c)
		if len(f) < 4 || f[0] != "kubectl" || f[1] != "apply" {
			continue
		}
		switch target := f[len(f)-1]; {
		case strings.Contains(c, "deploy/k8s"):
			t.Errorf("guide: %q applies the repository's manifests (VERSION images, example addresses), not the operator's overlay", c)
		case (f[2] == "-k" && filepath.Clean(target) == filepath.Clean(overlay)) || (f[len(f)-2] == "-f" && target == built && built != ""):
			if !strings.Contains(c, "--dry-run") {
				applied = true
			}
		default:
			t.Errorf("guide: %q applies neither the overlay %s nor its build %q", c, overlay, built)
		}
	}
	if !applied {
		t.Errorf("guide: no command applies the overlay %s (kubectl apply -k %s, or -f of its kustomize build)", overlay, overlay)
	}

	nodeReads, apiReads := reads(t)
	secrets := exampleSecrets(t)
	check := func(t *testing.T, overlay, pubsubType, repoDir string) {
		cmd := exec.Command(kubectl, "kustomize", overlay)
		cmd.Dir = work
		out, err := cmd.Output()
		if err != nil {
			msg := ""
			if ee, ok := err.(*exec.ExitError); ok {
				msg = string(ee.Stderr)
			}
			t.Fatalf("the guide's kubectl kustomize %s: %v\n%s", overlay, err, msg)
		}
		b := &Build{Dir: "guide:" + overlay}
		for i, raw := range SplitDocs(out) {
			d, err := Decode("kubectl kustomize "+overlay, i, raw)
			if err != nil {
				t.Fatal(err)
			}
			b.Docs = append(b.Docs, d)
			b.Namespaces = append(b.Namespaces, objectNamespace(d.Obj))
		}
		(&checker{t: t, b: b, secrets: secrets}).run(pubsubType, nodeReads, apiReads)
		newVariant(t, b.Dir, pubsubType, b, secrets).operations()
		// What the overlay is for, against the repository's own build.
		repoBuild, err := LoadBuild(root, repoDir)
		if err != nil {
			t.Fatal(err)
		}
		guideWorkload(t, b, repoBuild)
	}
	t.Run("redis", func(t *testing.T) { check(t, overlay, "pubsub.redis", ".") })

	// Kafka, as the guide says: the kafka overlay as the resource, and
	// kafka-brokers.yaml for the Component pubsub.
	t.Run("kafka", func(t *testing.T) {
		k := g.files[filepath.Join(overlay, "kustomization.yaml")]
		_, ok := g.files[filepath.Join(overlay, "kafka-brokers.yaml")]
		resource := "- ../workmanager/deploy/k8s\n"
		patch := "- path: redis-host.yaml\n  target: {kind: Component, name: pubsub}\n"
		if !ok || strings.Count(k, resource) != 1 || strings.Count(k, patch) != 1 {
			t.Fatalf("guide: the Kafka instructions (resource %q, the pubsub patch %q, a file kafka-brokers.yaml) no longer match %s/kustomization.yaml", resource, patch, overlay)
		}
		k = strings.Replace(k, resource, "- ../workmanager/deploy/k8s/overlays/kafka\n", 1)
		k = strings.Replace(k, patch, strings.Replace(patch, "redis-host.yaml", "kafka-brokers.yaml", 1), 1)
		kdir := overlay + "-kafka"
		if err := os.MkdirAll(filepath.Join(work, kdir), 0o755); err != nil {
			t.Fatal(err)
		}
		for p, body := range g.files {
			if filepath.Dir(p) != overlay {
				continue
			}
			if filepath.Base(p) == "kustomization.yaml" {
				body = k
			}
			if err := os.WriteFile(filepath.Join(work, kdir, filepath.Base(p)), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		check(t, kdir, "pubsub.kafka", "overlays/kafka")
	})
}

// guideWorkload: the operator's build runs the operator's images and
// reaches the operator's servers, and keeps every Component's keyPrefix.
func guideWorkload(t *testing.T, b, repoBuild *Build) {
	t.Helper()
	repoImages := map[string]bool{}
	for _, d := range repoBuild.Find("Deployment") {
		dep := d.Obj.(*appsv1.Deployment)
		repoImages[dep.Spec.Template.Annotations["dapr.io/sidecar-image"]] = true
		for _, c := range dep.Spec.Template.Spec.Containers {
			repoImages[c.Image] = true
		}
	}
	for _, d := range b.Find("Deployment") {
		dep := d.Obj.(*appsv1.Deployment)
		imgs := []string{dep.Spec.Template.Annotations["dapr.io/sidecar-image"]}
		for _, c := range dep.Spec.Template.Spec.Containers {
			imgs = append(imgs, c.Image)
		}
		for _, img := range imgs {
			if strings.HasSuffix(img, ":VERSION") || repoImages[img] {
				t.Errorf("guide: %s still runs the repository's placeholder image %q: the pull fails", dep.Name, img)
			}
		}
	}
	for _, name := range []string{"TEMPORAL_ADDRESS"} {
		got, _ := b.Get("ConfigMap", "workmanager-shared").(*corev1.ConfigMap)
		orig, _ := repoBuild.Get("ConfigMap", "workmanager-shared").(*corev1.ConfigMap)
		if got == nil || orig == nil || got.Data[name] == orig.Data[name] {
			t.Errorf("guide: %s is left at the repository's example", name)
		}
	}
	for _, d := range repoBuild.Find("Component") {
		orig := d.Obj.(*DaprComponent)
		var comp *DaprComponent
		for _, g := range b.Find("Component") {
			if c := g.Obj.(*DaprComponent); c.Metadata.Name == orig.Metadata.Name {
				comp = c
			}
		}
		if comp == nil {
			t.Errorf("guide: the overlay lost Component %s", orig.Metadata.Name)
			continue
		}
		if m, ok := orig.Meta("keyPrefix"); ok {
			got, ok := comp.Meta("keyPrefix")
			if !ok || got.Value == nil || m.Value == nil || *got.Value != *m.Value {
				t.Errorf("guide: Component %s lost keyPrefix %v: the API and the nodes would read different keys", comp.Metadata.Name, *m.Value)
			}
		}
		for _, addr := range []string{"redisHost", "brokers"} {
			if m, ok := orig.Meta(addr); ok {
				if got, ok := comp.Meta(addr); !ok || got.Value == nil || *got.Value == *m.Value {
					t.Errorf("guide: Component %s: %s is left at the repository's example", comp.Metadata.Name, addr)
				}
			}
		}
		if len(comp.Spec.Metadata) != len(orig.Spec.Metadata) {
			t.Errorf("guide: Component %s has %d metadata items, the repository's %d: the overlay must change values, not the list", comp.Metadata.Name, len(comp.Spec.Metadata), len(orig.Spec.Metadata))
		}
	}
}
