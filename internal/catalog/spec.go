package catalog

import (
	"errors"
	"fmt"
	"regexp"

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
	case topic == "":
		return fmt.Errorf("%w: topic is empty", ErrInvalidSpec)
	case !topicRE.MatchString(topic):
		return fmt.Errorf("%w: topic %q must match %s", ErrInvalidSpec, topic, topicRE)
	case reservedTopics[topic] != "":
		return fmt.Errorf("%w: topic %q is reserved for %s", ErrInvalidSpec, topic, reservedTopics[topic])
	case group != "" && !groupRE.MatchString(group):
		return fmt.Errorf("%w: group %q must match %s", ErrInvalidSpec, group, groupRE)
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
