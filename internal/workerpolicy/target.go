package workerpolicy

import (
	"fmt"
	"net/url"
	"path"
	"strings"
)

// Bounds of a gateway target.
const (
	MaxServiceLen = 253
	MaxMethodLen  = 2048
)

// ReservedAppIDs are the Dapr app ids of WorkManager itself (the nodes'
// and the API's, as deploy/k8s and make run name them): no gateway call
// may reach them. The node adds the app id its daprd reports.
var ReservedAppIDs = []string{"workmanager", "workmanager-api"}

// QueryMarker in the method part of an allowed_gateway_targets pattern (a
// literal '?', escaped for path.Match) is the only way a worker's gateway
// call may carry a query: "billing/search\?*".
const QueryMarker = `\?`

// ValidateService checks that service names a Dapr application: a Dapr app
// id, optionally with its namespace ("app.namespace"), or an HTTPEndpoint
// resource name. That is 1 to MaxServiceLen of A-Z a-z 0-9 - _ . starting
// and ending with a letter or digit, no empty dot-separated part. So it is
// never a URL: daprd 1.14 treats an app id starting with http:// or
// https:// as a base URL and appends the method to it as written, which
// would make the gateway a proxy to daprd's own API on 127.0.0.1 and to
// anything the node reaches.
func ValidateService(service string) error {
	if service == "" || len(service) > MaxServiceLen {
		return fmt.Errorf("gateway service %q must be a Dapr app id of 1 to %d characters: %w", clip(service), MaxServiceLen, ErrDenied)
	}
	for i, c := range service {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("gateway service %q has %q at position %d: a service is a Dapr app id (A-Z a-z 0-9 - _ .), never a URL or host:port: %w", clip(service), c, i, ErrDenied)
		}
	}
	for _, part := range strings.Split(service, ".") {
		if part == "" || !alnum(part[0]) || !alnum(part[len(part)-1]) {
			return fmt.Errorf("gateway service %q: each dot-separated part must start and end with a letter or digit: %w", clip(service), ErrDenied)
		}
	}
	return nil
}

// ReservedService reports whether service is one of ids (case-insensitive),
// alone or with a namespace ("workmanager.default").
func ReservedService(service string, ids []string) bool {
	app, _, _ := strings.Cut(service, ".")
	for _, id := range ids {
		if id != "" && (strings.EqualFold(service, id) || strings.EqualFold(app, id)) {
			return true
		}
	}
	return false
}

// ValidateMethod checks a gateway method: a relative path in canonical form
// (what path.Clean leaves alone) of 1 to MaxMethodLen bytes. It refuses a
// leading '/', empty, '.' and '..' segments (also as "..;x" and
// percent-encoded: %2e%2e, %2f, %5c, double encoding), backslashes,
// fragments, control characters and spaces, and a query ('?') unless
// allowQuery.
func ValidateMethod(method string, allowQuery bool) error {
	if method == "" || len(method) > MaxMethodLen {
		return fmt.Errorf("gateway method must be 1 to %d bytes: %w", MaxMethodLen, ErrDenied)
	}
	p, query, hasQuery := strings.Cut(method, "?")
	if hasQuery && !allowQuery {
		return fmt.Errorf("gateway method %q carries a query: send parameters in the body, or allow the query in allowed_gateway_targets (%q, e.g. \"billing/search%s*\"): %w", clip(method), QueryMarker, QueryMarker, ErrDenied)
	}
	if err := methodPath(method, p, false); err != nil {
		return err
	}
	if strings.Contains(p, "%") {
		// Whatever the backend decodes must pass too; a second level of
		// encoding has no honest use.
		dec, err := url.PathUnescape(p)
		if err != nil {
			return fmt.Errorf("gateway method %q: bad percent-encoding: %w", clip(method), ErrDenied)
		}
		if strings.Contains(dec, "%") {
			return fmt.Errorf("gateway method %q is encoded twice: %w", clip(method), ErrDenied)
		}
		if strings.Contains(dec, "?") || strings.Count(dec, "/") != strings.Count(p, "/") {
			return fmt.Errorf("gateway method %q encodes a '/' or '?': %w", clip(method), ErrDenied)
		}
		if err := methodPath(method, dec, true); err != nil {
			return err
		}
	}
	if hasQuery {
		for _, c := range query {
			if c < 0x21 || c == 0x7f || c == '#' || c == '\\' {
				return fmt.Errorf("gateway method %q: the query has %q: %w", clip(method), c, ErrDenied)
			}
		}
	}
	return nil
}

// methodPath checks the path part p of method (decoded: p is its
// percent-decoded form, where a space or '#' is data).
func methodPath(method, p string, decoded bool) error {
	if p == "" {
		return fmt.Errorf("gateway method %q has no path: %w", clip(method), ErrDenied)
	}
	if p[0] == '/' {
		return fmt.Errorf("gateway method %q starts with '/': a method is relative to the service: %w", clip(method), ErrDenied)
	}
	for _, c := range p {
		if c < 0x20 || c == 0x7f || c == '\\' || !decoded && (c == ' ' || c == '#') {
			return fmt.Errorf("gateway method %q has %q: %w", clip(method), c, ErrDenied)
		}
	}
	for _, seg := range strings.Split(p, "/") {
		if s, _, _ := strings.Cut(seg, ";"); strings.Trim(s, ".") == "" {
			return fmt.Errorf("gateway method %q has the segment %q: a method never climbs or has empty segments: %w", clip(method), seg, ErrDenied)
		}
	}
	if path.Clean(p) != p {
		return fmt.Errorf("gateway method %q is not in canonical form (%q): %w", clip(method), path.Clean(p), ErrDenied)
	}
	return nil
}

// CheckTarget is what every gateway call passes, whatever the engine: the
// service is a Dapr app id (ValidateService) other than reserved's
// (ReservedService), and the method is a canonical relative path
// (ValidateMethod) with a query only when allowed (the worker's
// allowed_gateway_targets) has a pattern with QueryMarker that matches
// "service/method?query".
func CheckTarget(service, method string, reserved, allowed []string) error {
	if err := ValidateService(service); err != nil {
		return err
	}
	if ReservedService(service, reserved) {
		return fmt.Errorf("gateway service %q is WorkManager itself: %w", service, ErrDenied)
	}
	return ValidateMethod(method, strings.Contains(method, "?") && queryAllowed(allowed, service+"/"+method))
}

func queryAllowed(allowed []string, target string) bool {
	for _, p := range allowed {
		if strings.Contains(p, QueryMarker) {
			if ok, _ := path.Match(p, target); ok {
				return true
			}
		}
	}
	return false
}

// validateTargetPattern checks one allowed_gateway_targets entry,
// "service/method" where either part may be a pattern: the service part
// is an app id pattern (no scheme, ':' or host:port; a literal one is
// checked like a call's and may not be WorkManager's own), the method part
// a relative path that does not climb.
func validateTargetPattern(p string) error {
	service, method, ok := strings.Cut(p, "/")
	if !ok || service == "" || method == "" {
		return fmt.Errorf("allowed_gateway_targets: %q must be \"service/method\" (either may be a pattern, e.g. \"billing/*\")", p)
	}
	if strings.ContainsAny(service, "*?[") {
		for _, c := range service {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-_.*?[]^!", c)) {
				return fmt.Errorf("allowed_gateway_targets: %q: the service part has %q; a service is a Dapr app id (A-Z a-z 0-9 - _ .), never a URL or host:port", p, c)
			}
		}
	} else {
		if err := ValidateService(service); err != nil {
			return fmt.Errorf("allowed_gateway_targets: %q: %v", p, strings.TrimSuffix(err.Error(), ": "+ErrDenied.Error()))
		}
		if ReservedService(service, ReservedAppIDs) {
			return fmt.Errorf("allowed_gateway_targets: %q: %q is WorkManager's own app id", p, service)
		}
	}
	m := strings.ReplaceAll(method, QueryMarker, "?")
	if strings.ContainsAny(m, "*?[\\") {
		if m[0] == '/' || strings.Contains(m, "..") || strings.Contains(m, "\\") || strings.Contains(m, "%") || strings.Contains(m, "//") {
			return fmt.Errorf("allowed_gateway_targets: %q: the method part must be a relative path that does not climb ('..', '/', '%%', '\\\\', '//')", p)
		}
		return nil
	}
	if err := ValidateMethod(m, true); err != nil {
		return fmt.Errorf("allowed_gateway_targets: %q: %v", p, strings.TrimSuffix(err.Error(), ": "+ErrDenied.Error()))
	}
	return nil
}

func alnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// clip bounds a value quoted in an error.
func clip(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}
