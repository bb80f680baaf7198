// Package validate checks the Kubernetes manifests in deploy/k8s offline
// (make k8s-validate, part of make test): every document decoded strictly
// into its Kubernetes or Dapr type, and the Deployments held to the
// settings the node and the API read (manifest_test.go). A module of its
// own, so that the main module does not depend on k8s.io/api.
package validate

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Doc is one YAML document of a manifest file, decoded into its type.
type Doc struct {
	File  string // relative to deploy/k8s
	Index int    // 0-based position in its file
	Kind  string
	Name  string
	Obj   any // *appsv1.Deployment, *corev1.Service, ..., *DaprComponent, *Kustomization
}

func (d Doc) String() string { return fmt.Sprintf("%s#%d (%s %s)", d.File, d.Index, d.Kind, d.Name) }

// kinds maps each kind the manifests may hold to its apiVersion and a new
// value of its type. Anything else is refused: add it here with its type.
var kinds = map[string]struct {
	apiVersion string
	new        func() any
}{
	"Deployment":          {"apps/v1", func() any { return &appsv1.Deployment{} }},
	"Service":             {"v1", func() any { return &corev1.Service{} }},
	"ConfigMap":           {"v1", func() any { return &corev1.ConfigMap{} }},
	"Secret":              {"v1", func() any { return &corev1.Secret{} }},
	"Namespace":           {"v1", func() any { return &corev1.Namespace{} }},
	"ServiceAccount":      {"v1", func() any { return &corev1.ServiceAccount{} }},
	"PodDisruptionBudget": {"policy/v1", func() any { return &policyv1.PodDisruptionBudget{} }},
	"NetworkPolicy":       {"networking.k8s.io/v1", func() any { return &networkingv1.NetworkPolicy{} }},
	"PriorityClass":       {"scheduling.k8s.io/v1", func() any { return &schedulingv1.PriorityClass{} }},
	"Component":           {"dapr.io/v1alpha1", func() any { return &DaprComponent{} }},
	"Configuration":       {"dapr.io/v1alpha1", func() any { return &DaprConfiguration{} }},
	"Kustomization":       {"kustomize.config.k8s.io/v1beta1", func() any { return &Kustomization{} }},
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// SplitDocs splits a multi-document YAML file, dropping documents that hold
// only comments and blank lines.
func SplitDocs(b []byte) [][]byte {
	var out [][]byte
	for _, part := range docSeparator.Split(string(b), -1) {
		empty := true
		for _, l := range strings.Split(part, "\n") {
			if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
				empty = false
				break
			}
		}
		if !empty {
			out = append(out, []byte(part))
		}
	}
	return out
}

// Decode decodes one document strictly into the type of its kind: an
// unknown or duplicate field, a value of the wrong type, a missing or
// unknown kind, or an apiVersion other than the kind's is an error.
func Decode(file string, index int, raw []byte) (Doc, error) {
	d := Doc{File: file, Index: index}
	var tm struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Metadata   metav1.ObjectMeta `json:"metadata"`
	}
	if err := yaml.Unmarshal(raw, &tm); err != nil {
		return d, fmt.Errorf("%s: %w", d, err)
	}
	d.Kind, d.Name = tm.Kind, tm.Metadata.Name
	if tm.Kind == "" {
		return d, fmt.Errorf("%s: no kind", d)
	}
	k, ok := kinds[tm.Kind]
	if !ok {
		return d, fmt.Errorf("%s: kind %q is not one this test knows (add it with its Go type)", d, tm.Kind)
	}
	if tm.APIVersion != k.apiVersion {
		return d, fmt.Errorf("%s: apiVersion %q, want %q", d, tm.APIVersion, k.apiVersion)
	}
	if tm.Kind != "Kustomization" && d.Name == "" {
		return d, fmt.Errorf("%s: no metadata.name", d)
	}
	d.Obj = k.new()
	if err := strictUnmarshal(raw, d.Obj); err != nil {
		return d, fmt.Errorf("%s: %w", d, err)
	}
	return d, nil
}

// strictUnmarshal decodes YAML the way the API server's strict field
// validation (kubectl apply --validate=strict) does: YAML to JSON refusing
// duplicate keys, then JSON with case-sensitive field names, refusing
// unknown and duplicate fields. A YAML number where the type wants a string
// (an env value written 8 instead of "8") is an error, as for kubectl.
func strictUnmarshal(raw []byte, v any) error {
	j, err := yaml.YAMLToJSONStrict(raw)
	if err != nil {
		return err
	}
	strict, err := sigsjson.UnmarshalStrict(j, v, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// LoadFile reads and decodes every document of a manifest file; rel is its
// path relative to root.
func LoadFile(root, rel string) ([]Doc, error) {
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		return nil, err
	}
	if bytes.Contains(b, []byte("\t")) {
		return nil, fmt.Errorf("%s: holds a tab character", rel)
	}
	var docs []Doc
	for i, raw := range SplitDocs(b) {
		d, err := Decode(rel, i, raw)
		if err != nil {
			return nil, err
		}
		docs = append(docs, d)
	}
	if len(docs) == 0 {
		return nil, fmt.Errorf("%s: no document", rel)
	}
	return docs, nil
}

// Kustomization is the part of kustomize's kustomization.yaml these
// manifests use; another field is refused until it is added here.
type Kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace,omitempty"`
	Resources  []string `json:"resources,omitempty"`
	Patches    []struct {
		Path string `json:"path"`
	} `json:"patches,omitempty"`
}

// DaprComponent is Dapr's Component (dapr.io/v1alpha1), as its
// documentation and pkg/apis/components/v1alpha1 describe it.
type DaprComponent struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		Type         string          `json:"type"`
		Version      string          `json:"version"`
		IgnoreErrors bool            `json:"ignoreErrors,omitempty"`
		InitTimeout  string          `json:"initTimeout,omitempty"`
		Metadata     []DaprNameValue `json:"metadata"`
	} `json:"spec"`
	Auth *struct {
		SecretStore string `json:"secretStore"`
	} `json:"auth,omitempty"`
	Scopes []string `json:"scopes,omitempty"`
}

// DaprNameValue is one metadata item. Dapr takes any JSON value; these
// manifests write every value as a string, as Dapr's documentation does,
// so a bare number or boolean is refused here.
type DaprNameValue struct {
	Name         string  `json:"name"`
	Value        *string `json:"value,omitempty"`
	SecretKeyRef *struct {
		Name string `json:"name"`
		Key  string `json:"key"`
	} `json:"secretKeyRef,omitempty"`
	EnvRef string `json:"envRef,omitempty"`
}

// Meta returns the metadata item name.
func (c *DaprComponent) Meta(name string) (DaprNameValue, bool) {
	for _, m := range c.Spec.Metadata {
		if m.Name == name {
			return m, true
		}
	}
	return DaprNameValue{}, false
}

// DaprConfiguration is Dapr's Configuration (dapr.io/v1alpha1), the parts
// of pkg/apis/configuration/v1alpha1 these manifests may use.
type DaprConfiguration struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		Secrets *struct {
			Scopes []struct {
				StoreName      string   `json:"storeName"`
				DefaultAccess  string   `json:"defaultAccess,omitempty"`
				AllowedSecrets []string `json:"allowedSecrets,omitempty"`
				DeniedSecrets  []string `json:"deniedSecrets,omitempty"`
			} `json:"scopes"`
		} `json:"secrets,omitempty"`
		Metric  *daprMetric `json:"metric,omitempty"`
		Metrics *daprMetric `json:"metrics,omitempty"`
		Tracing *struct {
			SamplingRate string `json:"samplingRate"`
			Stdout       *bool  `json:"stdout,omitempty"`
			Zipkin       *struct {
				EndpointAddress string `json:"endpointAddress"`
			} `json:"zipkin,omitempty"`
			Otel *struct {
				Protocol        string `json:"protocol"`
				EndpointAddress string `json:"endpointAddress"`
				IsSecure        *bool  `json:"isSecure"`
			} `json:"otel,omitempty"`
		} `json:"tracing,omitempty"`
		Features []struct {
			Name    string `json:"name"`
			Enabled *bool  `json:"enabled"`
		} `json:"features,omitempty"`
		Logging *struct {
			APILogging *struct {
				Enabled          *bool `json:"enabled,omitempty"`
				ObfuscateURLs    *bool `json:"obfuscateURLs,omitempty"`
				OmitHealthChecks *bool `json:"omitHealthChecks,omitempty"`
			} `json:"apiLogging,omitempty"`
		} `json:"logging,omitempty"`
		Components *struct {
			Deny []string `json:"deny,omitempty"`
		} `json:"components,omitempty"`
	} `json:"spec"`
}

type daprMetric struct {
	Enabled *bool `json:"enabled"`
}
