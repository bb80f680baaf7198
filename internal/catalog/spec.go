package catalog

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/virtufin/workmanager/internal/infraevents"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/publish"
)

// ErrInvalidSpec: a create request is malformed.
var ErrInvalidSpec = errors.New("invalid worker spec")

var (
	topicRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._\-/:]{0,248}$`)
	groupRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._\-]{0,127}$`)
	sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// reservedTopics carry WorkManager's own events: lifecycle events (a worker
// subscribed to its own error events could loop) and the nodes' broker probes.
var reservedTopics = map[string]string{
	lifecycleevents.Topic: "lifecycle events",
	publish.ProbeTopic:    "the nodes' broker probes",
}

// ValidateSpec checks the parts of a worker spec that need no engine:
// supported lists the MIME types engines are registered for.
func ValidateSpec(mimeType, topic, group string, supported []string) error {
	switch {
	case mimeType == "":
		return fmt.Errorf("%w: mime_type is empty (supported: %v)", ErrInvalidSpec, supported)
	case !contains(supported, mimeType):
		return fmt.Errorf("%w: unknown mime_type %q (supported: %v)", ErrInvalidSpec, mimeType, supported)
	case ValidateTopic(topic) != nil:
		return ValidateTopic(topic)
	case strings.HasPrefix(topic, infraevents.TopicPrefix):
		return fmt.Errorf("%w: topic %q is reserved: topics starting with %q carry WorkManager's infrastructure events", ErrInvalidSpec, topic, infraevents.TopicPrefix)
	case reservedTopics[topic] != "":
		return fmt.Errorf("%w: topic %q is reserved for %s", ErrInvalidSpec, topic, reservedTopics[topic])
	case group != "" && !groupRE.MatchString(group):
		return fmt.Errorf("%w: group %q must match %s", ErrInvalidSpec, group, groupRE)
	}
	return nil
}

// Bounds of a worker's retry policy (Worker.MaxAttempts, RetryBackoff).
const (
	MaxRetryAttempts = 100
	MaxRetryBackoff  = time.Hour
)

// ValidateRetryPolicy checks a retry policy as the API takes it: attempts
// 0 (cluster default) or 1..MaxRetryAttempts, backoff in milliseconds 0
// (cluster default) up to MaxRetryBackoff.
func ValidateRetryPolicy(maxAttempts int, backoffMS int64) error {
	switch {
	case maxAttempts < 0 || maxAttempts > MaxRetryAttempts:
		return fmt.Errorf("%w: retry_policy.max_attempts %d must be 0 (cluster default) or 1..%d", ErrInvalidSpec, maxAttempts, MaxRetryAttempts)
	case backoffMS < 0 || backoffMS > MaxRetryBackoff.Milliseconds():
		return fmt.Errorf("%w: retry_policy.backoff_ms %d must be 0 (cluster default) to %d (%s)", ErrInvalidSpec, backoffMS, MaxRetryBackoff.Milliseconds(), MaxRetryBackoff)
	}
	return nil
}

// MaxGroupKeyName is the longest group key (a CloudEvent attribute name).
const MaxGroupKeyName = 20

// ValidateGroupKey checks a worker's group key: the name of a CloudEvent
// attribute or extension (a-z 0-9, 1 to MaxGroupKeyName characters, as
// the CloudEvents specification names attributes), and only with a group.
// "" (no key) is valid.
func ValidateGroupKey(group, key string) error {
	if key == "" {
		return nil
	}
	if group == "" {
		return fmt.Errorf("%w: group_key %q needs a group: it keys the group's lock", ErrInvalidSpec, key)
	}
	if len(key) > MaxGroupKeyName {
		return fmt.Errorf("%w: group_key %q is longer than %d characters (a CloudEvent attribute name)", ErrInvalidSpec, key, MaxGroupKeyName)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return fmt.Errorf("%w: group_key %q has %q at position %d: a CloudEvent attribute name has only a-z and 0-9 (e.g. subject, partitionkey)", ErrInvalidSpec, key, c, i)
		}
	}
	return nil
}

// ValidateTopic checks a topic name (the same rule as a worker's topic).
func ValidateTopic(topic string) error {
	switch {
	case topic == "":
		return fmt.Errorf("%w: topic is empty", ErrInvalidSpec)
	case !topicRE.MatchString(topic):
		return fmt.Errorf("%w: topic %q must match %s", ErrInvalidSpec, topic, topicRE)
	}
	return nil
}

// ValidateSHA256 checks a lowercase hex SHA-256.
func ValidateSHA256(s string) error {
	if !sha256RE.MatchString(s) {
		return fmt.Errorf("%w: sha256 %q is not 64 lowercase hex digits", ErrInvalidSpec, s)
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
