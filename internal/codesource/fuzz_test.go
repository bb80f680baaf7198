package codesource_test

import (
	"errors"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/virtufin/workmanager/internal/codesource"
)

var rules = []string{
	"scheme", "userinfo", "host_not_allowed", "address_class", "non_canonical_address",
	"redirect", "too_many_redirects", "unpinned", "url_too_long", "bad_host",
}

func FuzzValidateURL(f *testing.F) {
	for _, raw := range []string{
		"http://code.example/x.py", "https://Code.Example.:8443/x", "http://93.184.216.34/",
		"http://127.0.0.1/", "http://[::1]/", "http://[::ffff:127.0.0.1]/", "http://[::ffff:7f00:1]/",
		"http://[64:ff9b::a00:1]/", "http://[fe80::1%25eth0]/", "http://2130706433/",
		"http://0x7f000001/", "http://017700000001/", "http://0177.0.0.1/", "http://127.1/",
		"http://0x7f.1/", "http://10.0.0.1./", "http://8.8.8.8./", "http://0x/", "http://0/",
		"http://user:pw@code.example/", "http://code.example@10.0.0.1/", "ftp://x/", "file:///etc/passwd",
		"gopher://x:70/_", "data:text/plain,x", "http:///x", "http:x", "http://%C3%A9.example/",
		"http://a..b/", "http://169.254.43518/", "http://[2001:db8::1]/",
	} {
		f.Add(raw, goodSHA)
	}
	f.Add("http://code.example/", "")
	f.Add("http://code.example/", "ABC")
	policies := []codesource.Policy{
		{},
		{AllowUnpinned: true},
		{AllowLoopback: true, AllowUnpinned: true},
		{AllowedHosts: []string{"*.example.com", "code.example"}},
	}
	f.Fuzz(func(t *testing.T, raw, sha string) {
		for i, p := range policies {
			err := p.ValidateURL(raw, sha)
			if i == 0 {
				if err2 := codesource.ValidateURL(raw, sha); (err == nil) != (err2 == nil) {
					t.Fatalf("ValidateURL and Policy{}.ValidateURL disagree: %v, %v", err, err2)
				}
			}
			if err != nil {
				checkValidateError(t, raw, err)
				continue
			}
			checkAccepted(t, p, raw, sha)
		}
	})
}

func checkValidateError(t *testing.T, raw string, err error) {
	forbidden, invalid := errors.Is(err, codesource.ErrForbidden), errors.Is(err, codesource.ErrInvalid)
	if forbidden == invalid {
		t.Fatalf("ValidateURL(%q): %v is forbidden=%v invalid=%v", raw, err, forbidden, invalid)
	}
	var r *codesource.Refusal
	if forbidden && (!errors.As(err, &r) || !slices.Contains(rules, r.Rule)) {
		t.Fatalf("ValidateURL(%q): %v has no known rule", raw, err)
	}
	if len(raw) > codesource.MaxURLLength && strings.Contains(err.Error(), raw) {
		t.Fatalf("an over-long URL is echoed")
	}
	if u, perr := url.Parse(raw); perr == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok && len(pw) >= 8 && !strings.Contains(strings.Replace(raw, pw, "", 1), pw) &&
			strings.Contains(err.Error(), pw) {
			t.Fatalf("ValidateURL(%q): %v echoes the password", raw, err)
		}
	}
}

func checkAccepted(t *testing.T, p codesource.Policy, raw, sha string) {
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("accepted %q, which does not parse: %v", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.User != nil || u.Hostname() == "" || len(raw) > codesource.MaxURLLength {
		t.Fatalf("accepted %q", raw)
	}
	if sha == "" && !p.AllowUnpinned {
		t.Fatalf("accepted %q unpinned", raw)
	}
	host := strings.ToLower(u.Hostname())
	if strings.ContainsAny(host, "%_") {
		t.Fatalf("accepted host %q", host)
	}
	allowed := func(a netip.Addr) bool {
		c := codesource.Classify(a)
		return c == "" || p.AllowLoopback && c == "loopback"
	}
	if a, ok := codesource.ParseLooseIPv4(strings.TrimSuffix(host, ".")); ok {
		if a.String() != host {
			t.Fatalf("accepted %q: host %q is not canonical", raw, host)
		}
		if !allowed(a) {
			t.Fatalf("accepted %q: %s is %s", raw, a, codesource.Classify(a))
		}
	}
	if a, err := netip.ParseAddr(host); err == nil && !allowed(a) {
		t.Fatalf("accepted %q: %s is %s", raw, a, codesource.Classify(a))
	}
}

func FuzzClassify(f *testing.F) {
	for _, s := range []string{
		"127.0.0.1", "10.0.0.1", "169.254.169.254", "8.8.8.8", "100.100.100.200", "255.255.255.255",
		"::1", "::ffff:127.0.0.1", "64:ff9b::a00:1", "64:ff9b:1::1", "2001::1", "2002::1",
		"fd00:ec2::254", "fe80::1", "2606:4700::1111", "::", "::a00:1",
	} {
		f.Add(netip.MustParseAddr(s).AsSlice(), "")
	}
	f.Add(netip.MustParseAddr("fe80::1").AsSlice(), "eth0")
	f.Add([]byte{1, 2, 3}, "")
	nat64 := netip.MustParsePrefix("64:ff9b::/96")
	f.Fuzz(func(t *testing.T, b []byte, zone string) {
		a, ok := netip.AddrFromSlice(b)
		if !ok {
			return
		}
		c := codesource.Classify(a)
		if a.Is4() {
			v4 := a.As4()
			mapped := netip.AddrFrom16(a.As16())
			if got := codesource.Classify(mapped); strings.HasPrefix(got, "ipv4_mapped:") != (c != "") ||
				c != "" && got != "ipv4_mapped:"+c {
				t.Fatalf("Classify(%s) = %q but Classify(%s) = %q", a, c, mapped, got)
			}
			n := nat64.Addr().As16()
			copy(n[12:], v4[:])
			if got := codesource.Classify(netip.AddrFrom16(n)); c == "" && got != "" || c != "" && got != "nat64:"+c {
				t.Fatalf("Classify(%s) = %q but its NAT64 form is %q", a, c, got)
			}
			return
		}
		if c == "" && !a.Is4In6() && !nat64.Contains(a) && !netip.MustParsePrefix("2000::/3").Contains(a) {
			t.Fatalf("Classify(%s) is public outside 2000::/3", a)
		}
		if zone != "" {
			if got := codesource.Classify(a.WithZone(zone)); got != "zone" {
				t.Fatalf("Classify(%s%%%s) = %q", a, zone, got)
			}
		}
	})
}

func FuzzParseLooseIPv4(f *testing.F) {
	for _, s := range []string{
		"127.0.0.1", "2130706433", "0x7f000001", "0X7F000001", "017700000001", "0177.0.0.1",
		"127.1", "0x7f.1", "0x7f.0.0.1", "10.0.0.1.", "1.2.65535", "4294967296", "08", "0x",
		"1..2", "256.0.0.1", "8.8.8.8", "010.8.8.8", "169.254.43518",
	} {
		f.Add(s)
	}
	p := codesource.Policy{AllowUnpinned: true}
	f.Fuzz(func(t *testing.T, s string) {
		a, ok := codesource.ParseLooseIPv4(s)
		if strict, err := netip.ParseAddr(s); err == nil && strict.Is4() && (!ok || a != strict) {
			t.Fatalf("ParseLooseIPv4(%q) = %v, %v; netip says %v", s, a, ok, strict)
		}
		if !ok {
			return
		}
		if !a.Is4() {
			t.Fatalf("ParseLooseIPv4(%q) = %v", s, a)
		}
		if b, ok := codesource.ParseLooseIPv4(a.String()); !ok || a != b {
			t.Fatalf("ParseLooseIPv4(%q) does not round-trip", a)
		}
		if len(s) > 200 {
			return
		}
		for _, host := range []string{s, s + "."} {
			err := p.ValidateURL("http://"+host+"/", "")
			var r *codesource.Refusal
			switch {
			case strings.ToLower(host) != a.String():
				if !errors.As(err, &r) || (r.Rule != "non_canonical_address" && r.Rule != "bad_host") {
					t.Fatalf("host %q (%s): %v", host, a, err)
				}
				if r.Rule == "bad_host" && !slices.ContainsFunc(strings.Split(host, "."), func(l string) bool { return len(l) > 63 }) {
					t.Fatalf("host %q (%s): %v", host, a, err)
				}
			case codesource.Classify(a) != "":
				if !errors.As(err, &r) || r.Rule != "address_class" {
					t.Fatalf("host %q (%s): %v", host, a, err)
				}
			case err != nil:
				t.Fatalf("host %q (%s): %v", host, a, err)
			}
		}
	})
}
