// Package tenant owns what a tenant is on the control plane: its name (from
// the caller's credentials, never from a request body), how a worker id
// carries it, and the topic prefix its workers are confined to.
//
// The default tenant keeps today's single-tenant shapes: its worker ids are
// bare UUIDs and its workers may use any topic. Any other tenant's worker
// ids are "<tenant>.<uuid>", so the tenant of a worker is read from its id
// (also by the catalog keys, the workflow ids and the logs that carry it),
// and its workers' topics must start with its prefix ("<tenant>." unless
// TENANT_TOPIC_PREFIXES maps it to another).
package tenant

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/google/uuid"
)

// Default is the tenant of credentials that name none.
const Default = "default"

// ErrInvalid is wrapped by every error about a malformed tenant name or
// prefix mapping.
var ErrInvalid = errors.New("invalid tenant")

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,62}$`)

// Validate checks a tenant name: 1 to 63 of a-z 0-9 -, starting with a
// letter.
func Validate(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("%w: %q must be 1 to 63 characters of a-z 0-9 -, starting with a letter", ErrInvalid, name)
	}
	return nil
}

// WorkerID is the id of a worker of tenant t whose own part is u (a UUID):
// u itself for the default tenant, "<t>.<u>" for any other.
func WorkerID(t string, u uuid.UUID) string {
	if t == Default || t == "" {
		return u.String()
	}
	return t + "." + u.String()
}

// ParseWorkerID splits a worker id into its tenant and UUID; ok is false
// when id is not shaped like a worker id.
func ParseWorkerID(id string) (t string, u uuid.UUID, ok bool) {
	t, rest, found := strings.Cut(id, ".")
	if !found {
		t, rest = Default, id
	} else if t == Default || Validate(t) != nil {
		return "", uuid.UUID{}, false
	}
	// uuid.Parse also takes braces, "urn:uuid:" and 32 bare hex digits:
	// only the canonical form is an id, so that each worker has one.
	u, err := uuid.Parse(rest)
	if err != nil || u.String() != rest {
		return "", uuid.UUID{}, false
	}
	return t, u, true
}

// Of is the tenant of a worker id (Default for a bare UUID or anything
// not shaped like a worker id).
func Of(id string) string {
	if t, _, ok := ParseWorkerID(id); ok {
		return t
	}
	return Default
}

// Prefixes maps tenants to the topic prefix their workers are confined to.
type Prefixes map[string]string

// ParsePrefixes reads TENANT_TOPIC_PREFIXES: comma-separated
// "tenant=prefix" pairs, e.g. "acme=acme.,globex=globex/". An empty prefix
// lets the tenant use any topic.
func ParsePrefixes(s string) (Prefixes, error) {
	p := Prefixes{}
	for _, pair := range strings.Split(s, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		t, prefix, ok := strings.Cut(pair, "=")
		t, prefix = strings.TrimSpace(t), strings.TrimSpace(prefix)
		if !ok {
			return nil, fmt.Errorf("%w: TENANT_TOPIC_PREFIXES entry %q must be tenant=prefix", ErrInvalid, pair)
		}
		if err := Validate(t); err != nil {
			return nil, fmt.Errorf("TENANT_TOPIC_PREFIXES entry %q: %w", pair, err)
		}
		if strings.ContainsAny(prefix, "*?[\\ ") {
			return nil, fmt.Errorf("%w: TENANT_TOPIC_PREFIXES entry %q: the prefix must be literal (no * ? [ \\ or spaces)", ErrInvalid, pair)
		}
		if _, dup := p[t]; dup {
			return nil, fmt.Errorf("%w: TENANT_TOPIC_PREFIXES names tenant %q twice", ErrInvalid, t)
		}
		p[t] = prefix
	}
	return p, nil
}

// Of is the topic prefix of tenant t: its mapping, else none for the
// default tenant and "<t>." for any other.
func (p Prefixes) Of(t string) string {
	if prefix, ok := p[t]; ok {
		return prefix
	}
	if t == Default || t == "" {
		return ""
	}
	return t + "."
}

// CheckTopic says whether a worker under prefix may use topic.
func CheckTopic(prefix, field, topic string) error {
	if !strings.HasPrefix(topic, prefix) {
		return fmt.Errorf("%s %q is outside the tenant's topics: it must start with %q", field, topic, prefix)
	}
	return nil
}
