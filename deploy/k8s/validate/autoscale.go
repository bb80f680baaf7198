package validate

import (
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The optional autoscaling examples (deploy/k8s/optional/keda and
// optional/hpa) hold kinds no build deploys: KEDA's ScaledObject and
// TriggerAuthentication, mirrored here with the fields the example uses
// (another field is refused until it is added), and autoscaling/v2's
// HorizontalPodAutoscaler.
func init() {
	kinds["ScaledObject"] = struct {
		apiVersion string
		new        func() any
	}{"keda.sh/v1alpha1", func() any { return &KEDAScaledObject{} }}
	kinds["TriggerAuthentication"] = struct {
		apiVersion string
		new        func() any
	}{"keda.sh/v1alpha1", func() any { return &KEDATriggerAuthentication{} }}
	kinds["HorizontalPodAutoscaler"] = struct {
		apiVersion string
		new        func() any
	}{"autoscaling/v2", func() any { return &autoscalingv2.HorizontalPodAutoscaler{} }}
}

// optionalExamples are the directories under deploy/k8s an operator adds
// to an overlay by choice, one at most of them: no build deploys them.
var optionalExamples = map[string]bool{"optional/keda": true, "optional/hpa": true}

// KEDAScaledObject is KEDA's ScaledObject (keda.sh/v1alpha1, as
// https://keda.sh/docs/2.14/reference/scaledobject-spec/ describes it),
// the fields the example uses.
type KEDAScaledObject struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		ScaleTargetRef struct {
			APIVersion string `json:"apiVersion,omitempty"`
			Kind       string `json:"kind,omitempty"`
			Name       string `json:"name"`
		} `json:"scaleTargetRef"`
		PollingInterval *int32 `json:"pollingInterval,omitempty"`
		CooldownPeriod  *int32 `json:"cooldownPeriod,omitempty"`
		MinReplicaCount *int32 `json:"minReplicaCount,omitempty"`
		MaxReplicaCount *int32 `json:"maxReplicaCount,omitempty"`
		Advanced        *struct {
			HorizontalPodAutoscalerConfig *struct {
				Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior,omitempty"`
			} `json:"horizontalPodAutoscalerConfig,omitempty"`
		} `json:"advanced,omitempty"`
		Triggers []KEDATrigger `json:"triggers"`
	} `json:"spec"`
}

// KEDATrigger is one of a ScaledObject's triggers: its scaler's metadata
// are strings.
type KEDATrigger struct {
	Type              string            `json:"type"`
	Metadata          map[string]string `json:"metadata"`
	AuthenticationRef *struct {
		Name string `json:"name"`
	} `json:"authenticationRef,omitempty"`
}

// KEDATriggerAuthentication is KEDA's TriggerAuthentication, with
// parameters from Secrets.
type KEDATriggerAuthentication struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		SecretTargetRef []struct {
			Parameter string `json:"parameter"`
			Name      string `json:"name"`
			Key       string `json:"key"`
		} `json:"secretTargetRef"`
	} `json:"spec"`
}

// GetNamespace is the ScaledObject's own metadata.namespace.
func (o *KEDAScaledObject) GetNamespace() string { return o.Metadata.Namespace }

// GetNamespace is the TriggerAuthentication's own metadata.namespace.
func (o *KEDATriggerAuthentication) GetNamespace() string { return o.Metadata.Namespace }
