// Package workerpolicy owns the rules of a worker's policy: the topics its
// outputs may be published to (never the reserved ones: WorkManager's own
// workmanager.* topics and the dead-letter topics; not its own input topic
// unless listed), and the shape of both pattern lists as CreateWorker takes
// them, and the form of every gateway call's target (CheckTarget: a Dapr
// app id, never WorkManager's own nor a URL, and a method that does not
// climb), which internal/gateway applies to every call. The engines hold
// gateway calls to the listed targets themselves
// (engines.CheckGatewayTarget). Patterns use path.Match: * matches any run
// of characters except '/', ? one character.
package workerpolicy

import (
	"errors"
	"fmt"
	"path"
	"strings"
)

const (
	// ReservedPrefix starts every topic WorkManager itself publishes to
	// (lifecycle and infra events).
	ReservedPrefix = "workmanager."
	// DeadSuffix ends every dead-letter topic.
	DeadSuffix = "-dead"
	// MaxPatterns and MaxPatternLen bound a policy.
	MaxPatterns   = 64
	MaxPatternLen = 256
)

// ErrDenied is wrapped by every refusal.
var ErrDenied = errors.New("not allowed by the worker's policy")

// Reserved reports whether no worker may publish to topic.
func Reserved(topic string) bool {
	return strings.HasPrefix(topic, ReservedPrefix) || strings.HasSuffix(topic, DeadSuffix)
}

// Validate checks a policy as CreateWorker takes it.
func Validate(outputs, targets []string) error {
	for _, l := range []struct {
		field    string
		patterns []string
	}{{"allowed_output_topics", outputs}, {"allowed_gateway_targets", targets}} {
		if len(l.patterns) > MaxPatterns {
			return fmt.Errorf("%s: %d patterns, at most %d", l.field, len(l.patterns), MaxPatterns)
		}
		for _, p := range l.patterns {
			if p == "" || len(p) > MaxPatternLen {
				return fmt.Errorf("%s: pattern %q must be 1 to %d characters", l.field, p, MaxPatternLen)
			}
			if _, err := path.Match(p, ""); err != nil {
				return fmt.Errorf("%s: pattern %q: %v", l.field, p, err)
			}
		}
	}
	for _, p := range outputs {
		if !strings.ContainsAny(p, "*?") && Reserved(p) {
			return fmt.Errorf("allowed_output_topics: %q is a reserved topic (%s* and *%s are never allowed)", p, ReservedPrefix, DeadSuffix)
		}
	}
	for _, p := range targets {
		if err := validateTargetPattern(p); err != nil {
			return err
		}
	}
	return nil
}

func matchAny(patterns []string, s string) bool {
	for _, p := range patterns {
		if ok, _ := path.Match(p, s); ok {
			return true
		}
	}
	return false
}

// CheckOutput says whether a worker reading input may publish to topic
// under allowed (its allowed_output_topics) and prefix (its tenant's topic
// prefix; "" for any topic).
func CheckOutput(prefix string, allowed []string, input, topic string) error {
	switch {
	case !strings.HasPrefix(topic, prefix):
		return fmt.Errorf("topic %q is outside the tenant's topics (prefix %q): %w", topic, prefix, ErrDenied)
	case Reserved(topic):
		return fmt.Errorf("topic %q is reserved (%s* and *%s): %w", topic, ReservedPrefix, DeadSuffix, ErrDenied)
	case len(allowed) > 0 && !matchAny(allowed, topic):
		return fmt.Errorf("topic %q is not in allowed_output_topics %q: %w", topic, allowed, ErrDenied)
	case len(allowed) == 0 && topic == input:
		return fmt.Errorf("topic %q is the worker's own input topic (a loop; list it in allowed_output_topics to allow it): %w", topic, ErrDenied)
	}
	return nil
}
