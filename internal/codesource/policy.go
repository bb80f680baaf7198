package codesource

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/virtufin/workmanager/internal/catalog"
)

// Defaults for the zero fields of a Policy.
const (
	DefaultTimeout      = 30 * time.Second
	DefaultMaxRedirects = 5
)

// Policy configures URL sources. The zero value is valid: any host whose
// addresses are all public, a sha256 required, MaxSize, 30 s, 5 redirects.
//
// A URL source must be at most MaxURLLength bytes, http or https, without
// user information, with a host that is a plain DNS name (ASCII letters,
// digits, '-' and '.'; one trailing dot allowed), a canonical dotted-quad
// IPv4 address or a bracketed IPv6 address without zone. Any other spelling
// of an IPv4 address ("2130706433", "0x7f.1", "127.1", "127.0.0.1.") is
// refused whatever address it denotes, as is every address Classify does
// not call public: literal, resolved, connected to, or reached by a
// redirect. AllowedHosts narrows the hosts further; it never lifts the
// address checks.
type Policy struct {
	// AllowedHosts (CODE_URL_ALLOWED_HOSTS), when set, are the only hosts
	// a URL source (and each redirect) may name: exact host names
	// ("code.example.com") or "*.example.com" (any subdomain, not the
	// apex); case-insensitive; a trailing dot is ignored.
	AllowedHosts []string
	// AllowUnpinned (CODE_URL_ALLOW_UNPINNED) allows a URL source without
	// a sha256. A sha256 that is given must always be well-formed.
	AllowUnpinned bool
	// AllowLoopback (CODE_URL_TEST_ALLOW_LOOPBACK, tests only) allows the
	// class "loopback": 127.0.0.0/8 and ::1, not their IPv4-mapped or
	// NAT64 forms. Every other rule stays on.
	AllowLoopback bool
	// MaxBytes caps the body; 0 means MaxSize.
	MaxBytes int64
	// Timeout bounds a whole fetch, redirects and body included; 0 means
	// DefaultTimeout.
	Timeout time.Duration
	// MaxRedirects bounds the redirects a fetch follows; 0 means
	// DefaultMaxRedirects.
	MaxRedirects int
}

// Validate checks the policy itself: well-formed AllowedHosts entries and
// no negative limits. The error names every wrong entry.
func (p Policy) Validate() error {
	var errs []error
	for i, e := range p.AllowedHosts {
		if why := checkAllowedEntry(e); why != "" {
			errs = append(errs, fmt.Errorf("allowed hosts entry %d (%q) %s", i, e, why))
		}
	}
	if p.MaxBytes < 0 {
		errs = append(errs, fmt.Errorf("max bytes %d is negative", p.MaxBytes))
	}
	if p.Timeout < 0 {
		errs = append(errs, fmt.Errorf("timeout %v is negative", p.Timeout))
	}
	if p.MaxRedirects < 0 {
		errs = append(errs, fmt.Errorf("max redirects %d is negative", p.MaxRedirects))
	}
	if len(errs) > 0 {
		return fmt.Errorf("code source policy: %w", errors.Join(errs...))
	}
	return nil
}

func checkAllowedEntry(e string) string {
	switch {
	case e == "":
		return "is empty"
	case strings.Contains(e, "://"):
		return "must not have a scheme"
	case strings.ContainsAny(e, "/?#"):
		return "must not have a path"
	case strings.Contains(e, ":"):
		return "must not have a port (IPv6 addresses are not supported)"
	case e == "*" || e == "*.":
		return "must not be a lone \"*\" (leave the list empty to allow any public host)"
	}
	name, wild := strings.CutPrefix(e, "*.")
	if strings.Contains(name, "*") {
		return "may use \"*\" only as a \"*.\" prefix"
	}
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	if !validHostName(name) {
		return "is not a valid host name"
	}
	if a, ok := parseLooseIPv4(name); ok {
		if wild {
			return "must not be a wildcard over an IPv4 address"
		}
		if a.String() != name {
			return "is a non-canonical spelling of an IPv4 address"
		}
	}
	return ""
}

// metadataHostNames are the well-known names of cloud instance metadata
// services (lowercase, no trailing dot). They are refused by name, before
// any DNS lookup: inside a cloud they resolve to the metadata address (which
// the address checks refuse too), and outside one a lookup failure must not
// be the only thing that stops them.
var metadataHostNames = map[string]bool{
	"metadata.google.internal":     true, // GCP
	"metadata.goog":                true, // GCP
	"metadata":                     true, // GCP short name, OpenStack
	"instance-data":                true, // AWS
	"instance-data.ec2.internal":   true, // AWS
	"metadata.azure.com":           true, // Azure
	"metadata.tencentyun.com":      true, // Tencent Cloud
	"metadata.platformequinix.com": true, // Equinix Metal
	"metadata.packet.net":          true, // Equinix Metal (legacy)
	"metadata.oraclecloud.com":     true, // Oracle Cloud
	"metadata.internal":            true,
}

// isMetadataHostName reports whether name (lowercase, no trailing dot) is
// a metadata service's well-known name.
func isMetadataHostName(name string) bool { return metadataHostNames[name] }

// validHostName: non-empty labels of ASCII letters, digits and '-', at most
// 63 bytes each and 253 in all.
func validHostName(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for l := range strings.SplitSeq(h, ".") {
		if l == "" || len(l) > 63 {
			return false
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

func (p Policy) withDefaults() Policy {
	if p.MaxBytes == 0 {
		p.MaxBytes = MaxSize
	}
	if p.Timeout == 0 {
		p.Timeout = DefaultTimeout
	}
	if p.MaxRedirects == 0 {
		p.MaxRedirects = DefaultMaxRedirects
	}
	return p
}

// allowed reports whether an address of class c may be connected to.
func (p Policy) allowed(c string) bool {
	return c == "" || c == "loopback" && p.AllowLoopback
}

// ValidateURL checks a URL source before anything is fetched, without DNS:
// the URL rules of Policy, the literal addresses, and the sha256 (required
// unless AllowUnpinned; when given, 64 lowercase hex digits). A refused
// source is a *Refusal (ErrForbidden); a malformed one wraps ErrInvalid.
func (p Policy) ValidateURL(raw, sha string) error {
	if err := p.Validate(); err != nil {
		return err
	}
	if len(raw) > MaxURLLength {
		return refuse(RuleURLTooLong, "the URL is longer than %d bytes", MaxURLLength)
	}
	u, err := url.Parse(raw)
	if err != nil {
		// Not the whole url.Error: its text repeats raw, user info included.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("%w: code.url is not a valid URL: %w", ErrInvalid, err)
	}
	if u.Scheme == "" {
		return fmt.Errorf("%w: code.url must be an absolute http or https URL", ErrInvalid)
	}
	if r := p.checkURL(u); r != nil {
		return r
	}
	if r := checkCredentials(u); r != nil {
		return r
	}
	switch {
	case sha == "" && !p.AllowUnpinned:
		return refuse(RuleUnpinned, "a sha256 is required for URL sources")
	case sha != "":
		if err := catalog.ValidateSHA256(sha); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalid, err)
		}
	}
	return nil
}

// credentialParams are query parameter names (lowercase) that carry
// credentials: a URL source is stored in the worker's history and in its
// workflow's history, where no secret may be. (Redirect targets, such as a
// presigned download URL, are not stored and are not held to this.)
var credentialParams = map[string]bool{
	"token": true, "access_token": true, "id_token": true, "refresh_token": true, "auth": true, "authorization": true,
	"api_key": true, "apikey": true, "api-key": true, "access_key": true, "accesskey": true, "secret": true,
	"client_secret": true, "password": true, "passwd": true, "pwd": true, "signature": true, "sig": true,
	"credential": true, "credentials": true, "jwt": true, "session": true, "sessionid": true,
	"x-amz-signature": true, "x-amz-credential": true, "x-amz-security-token": true,
	"x-goog-signature": true, "x-goog-credential": true,
}

// checkCredentials refuses a URL source whose query names a credential.
func checkCredentials(u *url.URL) *Refusal {
	for k := range u.Query() {
		if credentialParams[strings.ToLower(k)] {
			return refuse(RuleCredentials, "query parameter %q carries a credential; code URLs are stored in the worker's history, so they must hold none (serve the code without one, or send it inline)", k)
		}
	}
	return nil
}

// checkURL applies the rules that need no DNS to a URL source or a
// redirect's target.
func (p Policy) checkURL(u *url.URL) *Refusal {
	if u.Scheme != "http" && u.Scheme != "https" {
		return refuse(RuleScheme, "scheme %q is not allowed (only http and https)", u.Scheme)
	}
	if u.User != nil {
		return refuse(RuleUserinfo, "a URL with user information is not allowed")
	}
	return p.checkHost(u.Host)
}

// checkHost checks the host[:port] of a URL. url.Parse has decoded it;
// it lets '%' into a host only as "%25" (a '%', e.g. an IPv6 zone) or as
// encoded non-ASCII bytes, both refused here.
func (p Policy) checkHost(hostport string) *Refusal {
	hostname := hostport
	bracketed := strings.HasPrefix(hostport, "[")
	if bracketed {
		end := strings.Index(hostport, "]")
		if end < 0 {
			return refuse(RuleBadHost, "host %q is not valid", hostport)
		}
		hostname = hostport[1:end]
	} else if i := strings.LastIndex(hostport, ":"); i >= 0 {
		hostname = hostport[:i]
	}
	switch {
	case hostname == "":
		return refuse(RuleBadHost, "the URL has no host")
	case strings.Contains(hostname, "%"):
		return refuse(RuleBadHost, "the host must not contain '%%' (percent-encoding or an IPv6 zone)")
	}
	if bracketed {
		a, err := netip.ParseAddr(hostname)
		if err != nil || !a.Is6() {
			return refuse(RuleBadHost, "host %q is not a valid IPv6 address", hostname)
		}
		if !p.hostAllowed(strings.ToLower(hostname)) {
			return refuse(RuleHostNotAllowed, "host %q is not in the allowed hosts", hostname)
		}
		return p.checkAddr(hostname, a)
	}
	lower := strings.ToLower(hostname)
	name := strings.TrimSuffix(lower, ".")
	if !validHostName(name) {
		return refuse(RuleBadHost, "host %q is not a valid host name (ASCII letters, digits, '-' and '.')", hostname)
	}
	if isMetadataHostName(name) {
		return refuse(RuleMetadataHost, "host %q is a cloud metadata service's name; code cannot be fetched from it", hostname)
	}
	if !p.hostAllowed(name) {
		return refuse(RuleHostNotAllowed, "host %q is not in the allowed hosts", hostname)
	}
	if a, ok := parseLooseIPv4(name); ok {
		if a.String() != lower {
			return refuse(RuleNonCanonicalAddress, "host %q is an IPv4 address not spelt as a dotted quad", hostname)
		}
		return p.checkAddr(hostname, a)
	}
	return nil
}

// checkAddr refuses an address the user wrote literally unless allowed.
func (p Policy) checkAddr(host string, a netip.Addr) *Refusal {
	c := Classify(a)
	if p.allowed(c) {
		return nil
	}
	r := refuse(RuleAddressClass, "address %q is %s", host, c)
	r.class = c
	return r
}

// hostAllowed matches a lowercase host without trailing dot against
// AllowedHosts; an empty list allows any host.
func (p Policy) hostAllowed(host string) bool {
	if len(p.AllowedHosts) == 0 {
		return true
	}
	for _, e := range p.AllowedHosts {
		e = strings.TrimSuffix(strings.ToLower(e), ".")
		if suffix, wild := strings.CutPrefix(e, "*"); wild {
			if len(host) > len(suffix) && strings.HasSuffix(host, suffix) {
				return true
			}
		} else if host == e {
			return true
		}
	}
	return false
}
