package codesource

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/virtufin/workmanager/internal/catalog"
)

// Fetcher downloads code under a Policy.
//
// Every fetch uses its own transport: no proxy (never the environment's),
// no keep-alive (each hop resolves and checks afresh), no decompression.
// Its dialer resolves the host once, refuses it if any address is not
// allowed, and connects only to the checked addresses, so a second DNS
// answer cannot rebind it; the socket's Control hook checks the address
// once more. Every redirect is checked like the URL itself. A Fetcher
// holds no state between fetches and is safe for concurrent use.
type Fetcher struct {
	Policy Policy
	// Resolver resolves host names; nil: net.DefaultResolver. Injectable
	// for tests (DNS rebinding).
	Resolver interface {
		LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error)
	}
	// DialAddr, when set (tests only), is used instead of the real dial
	// after an address passed every check; it gets the checked "ip:port".
	DialAddr func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Fetch validates raw (Policy.ValidateURL), fetches it and returns the body
// after checking its SHA-256 (when given). A refusal by any rule, on the URL,
// a redirect or a connection, is a *Refusal (ErrForbidden). A 4xx, an
// oversized body or a wrong sha256 wraps ErrInvalid; network errors and 5xx
// do not, so callers may retry them.
func (f *Fetcher) Fetch(ctx context.Context, raw, sha string) ([]byte, error) {
	if err := f.Policy.ValidateURL(raw, sha); err != nil {
		return nil, err
	}
	p := f.Policy.withDefaults()
	u, err := url.Parse(raw)
	if err != nil { // cannot happen: ValidateURL parsed it
		return nil, fmt.Errorf("%w: code.url is not a valid URL", ErrInvalid)
	}
	tr := &http.Transport{
		Proxy:                  nil,
		DialContext:            f.dialer(p, hostKey(u.Hostname())),
		TLSHandshakeTimeout:    10 * time.Second,
		ResponseHeaderTimeout:  15 * time.Second,
		MaxResponseHeaderBytes: 64 << 10,
		DisableCompression:     true,
		DisableKeepAlives:      true,
		ForceAttemptHTTP2:      false,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, CheckRedirect: p.checkRedirect}

	ctx, cancel := context.WithTimeout(ctx, p.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, raw, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: code.url is not a valid URL", ErrInvalid)
	}
	resp, err := client.Do(req)
	if err != nil {
		var r *Refusal
		if errors.As(err, &r) {
			return nil, r
		}
		// Drop the url.Error: after a redirect its URL is what the remote
		// served.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("fetch of %s failed: %w", raw, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		return nil, fmt.Errorf("%w: fetch of %s failed: HTTP %d", ErrInvalid, raw, resp.StatusCode)
	case resp.StatusCode/100 != 2:
		return nil, fmt.Errorf("fetch of %s failed: HTTP %d", raw, resp.StatusCode)
	case resp.ContentLength > p.MaxBytes:
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrInvalid, raw, p.MaxBytes)
	}
	limit := p.MaxBytes
	if limit < math.MaxInt64 {
		limit++
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return nil, fmt.Errorf("fetch of %s failed: reading the body: %w", raw, err)
	}
	if int64(len(body)) > p.MaxBytes {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrInvalid, raw, p.MaxBytes)
	}
	// The actual digest is not reported: it would tell the user a digest
	// of whatever the URL served.
	if sha != "" && catalog.SHA256(body) != sha {
		return nil, fmt.Errorf("%w: sha256 mismatch for %s: expected %s", ErrInvalid, raw, sha)
	}
	return body, nil
}

// checkRedirect applies the URL rules to every hop (the dialer checks its
// addresses) and bounds the hops.
func (p Policy) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) > p.MaxRedirects {
		return refuse(RuleTooManyRedirects, "more than %d redirects", p.MaxRedirects)
	}
	if len(req.URL.String()) > MaxURLLength {
		return asRedirect(refuse(RuleURLTooLong, "the URL is too long"))
	}
	if r := p.checkURL(req.URL); r != nil {
		return asRedirect(r)
	}
	// The source URL, signed query and all, is nobody else's business.
	req.Header.Del("Referer")
	return nil
}

// hostKey is how hosts are compared: lowercase, without brackets and
// without one trailing dot.
func hostKey(host string) string {
	return strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
}

// dialer returns the transport's DialContext. userHost (a hostKey) is the
// host the user gave: refusals name it, and refusals for any other host
// (a redirect's target) name neither the host nor its addresses.
func (f *Fetcher) dialer(p Policy, userHost string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: 10 * time.Second, Control: p.control}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, portStr, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("%w: bad address to connect to", ErrInvalid)
		}
		port, err := strconv.ParseUint(portStr, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("%w: port %q is not valid", ErrInvalid, portStr)
		}
		key := hostKey(host)
		redirect := key != userHost
		addrs, err := f.resolve(ctx, p, host, key)
		if err != nil {
			var r *Refusal
			switch {
			case !redirect:
				return nil, err
			case errors.As(err, &r):
				return nil, asRedirect(r)
			default:
				return nil, &hiddenError{"resolving a redirect's host failed", err}
			}
		}
		var first error
		for _, a := range addrs {
			target := netip.AddrPortFrom(a, uint16(port)).String()
			var c net.Conn
			if f.DialAddr != nil {
				c, err = f.DialAddr(ctx, network, target)
			} else {
				c, err = d.DialContext(ctx, network, target)
			}
			if err == nil {
				return c, nil
			}
			var r *Refusal
			if errors.As(err, &r) {
				if redirect {
					return nil, asRedirect(r)
				}
				return nil, r
			}
			if first == nil {
				first = err
			}
			if ctx.Err() != nil {
				break
			}
		}
		what := fmt.Sprintf("%q", key)
		if redirect {
			what = "a redirect's host"
		}
		return nil, &hiddenError{"connecting to " + what + " failed: " + dialReason(first), first}
	}
}

// resolve returns the checked addresses of host (key is its hostKey): the
// literal address, or every address the resolver answers, all of which must
// be allowed.
func (f *Fetcher) resolve(ctx context.Context, p Policy, host, key string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a}, checkResolved(p, host, a)
	}
	if a, ok := parseLooseIPv4(key); ok && a.String() != strings.ToLower(host) {
		return nil, refuse(RuleNonCanonicalAddress, "host %q is an IPv4 address not spelt as a dotted quad", key)
	}
	var res interface {
		LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error)
	} = net.DefaultResolver
	if f.Resolver != nil {
		res = f.Resolver
	}
	ips, err := res.LookupIPAddr(ctx, host)
	if err != nil {
		// A DNSError's text names the DNS server: keep only its reason.
		reason := err.Error()
		var dnsErr *net.DNSError
		if errors.As(err, &dnsErr) {
			reason = dnsErr.Err
			// No such host is the user's mistake (a typo, an internal
			// name), not an outage: say so, and do not retry it.
			if dnsErr.IsNotFound {
				return nil, fmt.Errorf("%w: %w", ErrInvalid, &hiddenError{fmt.Sprintf("host %q of code.url does not resolve (no such host)", key), err})
			}
		}
		return nil, &hiddenError{fmt.Sprintf("resolving %q failed: %s", key, reason), err}
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("resolving %q failed: no addresses", key)
	}
	addrs := make([]netip.Addr, 0, len(ips))
	for _, ip := range ips {
		a, ok := netip.AddrFromSlice(ip.IP)
		if !ok {
			return nil, fmt.Errorf("resolving %q failed: a malformed address", key)
		}
		// A resolver's IPv4 answers may come as 16 bytes: the same host.
		a = a.Unmap().WithZone(ip.Zone)
		if err := checkResolved(p, key, a); err != nil {
			return nil, err
		}
		addrs = append(addrs, a)
	}
	return addrs, nil
}

// checkResolved refuses an address of host unless allowed; the refusal
// names the host and the class, never the address.
func checkResolved(p Policy, host string, a netip.Addr) error {
	c := Classify(a)
	if p.allowed(c) {
		return nil
	}
	return &Refusal{Rule: RuleAddressClass, Detail: fmt.Sprintf("an address of %q is %s", host, c), class: c}
}

// control is the dialer's Control hook: it checks the address the socket
// is actually connecting to, whatever led there.
func (p Policy) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return refuse(RuleAddressClass, "a connection to an unreadable address was refused")
	}
	c := Classify(ap.Addr().Unmap())
	if p.allowed(c) {
		return nil
	}
	return &Refusal{Rule: RuleAddressClass, Detail: "a connection to a " + c + " address was refused", class: c}
}

// dialReason is why a dial failed, without the address it dialed.
func dialReason(err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		err = op.Err
	}
	if err == nil {
		return "no address"
	}
	return err.Error()
}

// hiddenError keeps err in the chain (timeouts stay timeouts) under a
// message that does not repeat err's text, which may name an address.
type hiddenError struct {
	msg string
	err error
}

func (e *hiddenError) Error() string { return e.msg }
func (e *hiddenError) Unwrap() error { return e.err }
