// Package codesource owns getting a worker's code from where the user said
// it is: the size cap on inline code, and fetching a URL source without
// letting it reach anything but public hosts (SSRF): the checks on the URL,
// on every address its host resolves to, on every connection and on every
// redirect, and the SHA-256 pin on the body.
package codesource

import (
	"errors"
	"fmt"
)

// MaxSize is the default cap on a code body, inline or fetched.
const MaxSize = 16 << 20

var (
	// ErrInvalid: the source is malformed, too large, answered a 4xx or does
	// not match its sha256. Callers report it as an invalid argument.
	ErrInvalid = errors.New("invalid code source")
	// ErrForbidden: an SSRF rule refused the source (see Refusal). Callers
	// report it as permission denied.
	ErrForbidden = errors.New("code source refused")
)

// Rules a Refusal names.
const (
	RuleScheme              = "scheme"                // not http or https
	RuleUserinfo            = "userinfo"              // user:password@ in the URL
	RuleHostNotAllowed      = "host_not_allowed"      // not in Policy.AllowedHosts
	RuleAddressClass        = "address_class"         // an address is not public (see Classify)
	RuleNonCanonicalAddress = "non_canonical_address" // an IPv4 address not spelt as a dotted quad
	RuleRedirect            = "redirect"              // a redirect broke one of the rules above
	RuleTooManyRedirects    = "too_many_redirects"    // more than Policy.MaxRedirects
	RuleUnpinned            = "unpinned"              // no sha256 and not Policy.AllowUnpinned
	RuleURLTooLong          = "url_too_long"          // longer than MaxURLLength
	RuleBadHost             = "bad_host"              // empty, '%', or not a plain host name / [IPv6]
	RuleCredentials         = "credentials_in_url"    // a query parameter named like a credential
	RuleMetadataHost        = "metadata_host"         // a cloud metadata service's well-known host name
)

// MaxURLLength bounds the length of a URL source.
const MaxURLLength = 2048

// Refusal is the error for a source an SSRF rule refused:
// errors.Is(err, ErrForbidden) holds. Rule is one of the Rule* names; Detail
// says why, naming the host the user gave (never an address a name resolved
// to, nor anything the remote served).
type Refusal struct {
	Rule, Detail string

	// class is the address class behind an address_class refusal, so a
	// redirect refusal can name it without naming the redirect's target.
	class string
}

func (r *Refusal) Error() string {
	return fmt.Sprintf("code.url refused by rule %s: %s", r.Rule, r.Detail)
}

// Is makes errors.Is(r, ErrForbidden) true.
func (r *Refusal) Is(target error) bool { return target == ErrForbidden }

func refuse(rule, format string, args ...any) *Refusal {
	return &Refusal{Rule: rule, Detail: fmt.Sprintf(format, args...)}
}

// asRedirect turns a refusal of a redirect's target into a "redirect"
// refusal that names the rule (and address class) but not the target.
func asRedirect(r *Refusal) *Refusal {
	why := r.Rule
	if r.class != "" {
		why += ": " + r.class
	}
	return &Refusal{Rule: RuleRedirect, Detail: "a redirect was refused (" + why + ")", class: r.class}
}

// ValidateURL is Policy{}.ValidateURL: the checks under the default policy.
func ValidateURL(raw, sha string) error { return Policy{}.ValidateURL(raw, sha) }
