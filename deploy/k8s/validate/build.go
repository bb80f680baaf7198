package validate

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"sigs.k8s.io/yaml"
)

// Build is what one kustomization directory deploys: its resources,
// recursively, with its patches applied — a small subset of `kustomize
// build` (resources and strategic merge patches of built-in kinds), enough
// to check what each variant runs.
type Build struct {
	Dir  string // relative to deploy/k8s
	Docs []Doc
	// Namespaces are the Docs' namespaces after kustomize's namespace
	// transformers: the outermost kustomization that sets one wins, else
	// the document's own metadata.namespace.
	Namespaces []string
	// Files are the manifest files (relative to deploy/k8s) it read, as
	// resources or patches, kustomization files included.
	Files []string
}

// LoadBuild reads the kustomization in dir (relative to root).
func LoadBuild(root, dir string) (*Build, error) {
	b := &Build{Dir: dir}
	return b, b.load(root, dir, map[string]bool{})
}

func (b *Build) load(root, dir string, seen map[string]bool) error {
	// kustomize refuses a directory visited twice, and one that contains a
	// directory it visited ("cycle detected: candidate root … contains
	// visited root"): an overlay cannot include the kustomization above it.
	for v := range seen {
		if v == dir || dir == "." || strings.HasPrefix(v, dir+"/") {
			return fmt.Errorf("kustomization %s: contains or repeats %s, which kustomize refuses as a cycle", dir, v)
		}
	}
	seen[dir] = true
	start := len(b.Docs)
	kfile := filepath.Join(dir, "kustomization.yaml")
	docs, err := LoadFile(root, kfile)
	if err != nil {
		return err
	}
	if len(docs) != 1 || docs[0].Kind != "Kustomization" {
		return fmt.Errorf("%s: want exactly one Kustomization", kfile)
	}
	b.Files = append(b.Files, kfile)
	k := docs[0].Obj.(*Kustomization)
	for _, r := range k.Resources {
		p := filepath.Clean(filepath.Join(dir, r))
		st, err := os.Stat(filepath.Join(root, p))
		if err != nil {
			return fmt.Errorf("%s: resource %s: %w", kfile, r, err)
		}
		if st.IsDir() {
			if err := b.load(root, p, seen); err != nil {
				return err
			}
			continue
		}
		rd, err := LoadFile(root, p)
		if err != nil {
			return err
		}
		for _, d := range rd {
			if d.Kind == "Kustomization" {
				return fmt.Errorf("%s: a Kustomization listed as a resource", d)
			}
		}
		b.Files = append(b.Files, p)
		b.Docs = append(b.Docs, rd...)
		for _, d := range rd {
			b.Namespaces = append(b.Namespaces, objectNamespace(d.Obj))
		}
	}
	if k.Namespace != "" {
		for i := start; i < len(b.Docs); i++ {
			if !clusterScoped(b.Docs[i].Kind) {
				b.Namespaces[i] = k.Namespace
			}
		}
	}
	for _, pt := range k.Patches {
		p := filepath.Clean(filepath.Join(dir, pt.Path))
		pd, err := LoadFile(root, p)
		if err != nil {
			return err
		}
		b.Files = append(b.Files, p)
		for _, patch := range pd {
			if err := b.apply(root, patch); err != nil {
				return err
			}
		}
	}
	return nil
}

// apply applies a strategic merge patch to the resource of its kind and
// name, and decodes the result strictly again.
func (b *Build) apply(root string, patch Doc) error {
	for i, d := range b.Docs {
		if d.Kind != patch.Kind || d.Name != patch.Name {
			continue
		}
		var schema any
		switch d.Kind {
		case "Deployment":
			schema = appsv1.Deployment{}
		case "Namespace":
			schema = corev1.Namespace{}
		default:
			return fmt.Errorf("%s: patches of %s are not supported by this test", patch, d.Kind)
		}
		orig, err := json.Marshal(d.Obj)
		if err != nil {
			return err
		}
		raw, err := os.ReadFile(filepath.Join(root, patch.File))
		if err != nil {
			return err
		}
		pj, err := yaml.YAMLToJSON(SplitDocs(raw)[patch.Index])
		if err != nil {
			return fmt.Errorf("%s: %w", patch, err)
		}
		out, err := strategicpatch.StrategicMergePatch(orig, pj, schema)
		if err != nil {
			return fmt.Errorf("%s: %w", patch, err)
		}
		nd, err := Decode(d.File+" patched by "+patch.File, d.Index, out)
		if err != nil {
			return err
		}
		b.Docs[i] = nd
		return nil
	}
	return fmt.Errorf("%s: patches nothing in %s", patch, b.Dir)
}

// Find returns the build's documents of kind.
func (b *Build) Find(kind string) []Doc {
	var out []Doc
	for _, d := range b.Docs {
		if d.Kind == kind {
			out = append(out, d)
		}
	}
	return out
}

// Get returns the document of kind and name, or nil.
func (b *Build) Get(kind, name string) any {
	for _, d := range b.Docs {
		if d.Kind == kind && d.Name == name {
			return d.Obj
		}
	}
	return nil
}

// objectNamespace is a document's own metadata.namespace.
func objectNamespace(obj any) string {
	if o, ok := obj.(interface{ GetNamespace() string }); ok {
		return o.GetNamespace()
	}
	switch o := obj.(type) {
	case *DaprComponent:
		return o.Metadata.Namespace
	case *DaprConfiguration:
		return o.Metadata.Namespace
	}
	return ""
}

// clusterScoped reports whether objects of kind have no namespace
// (kustomize's namespace transformer leaves them alone).
func clusterScoped(kind string) bool {
	return kind == "Namespace" || kind == "PriorityClass"
}
