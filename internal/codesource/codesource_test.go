package codesource_test

import (
	"strings"
	"testing"

	"github.com/virtufin/workmanager/internal/codesource"
)

var goodSHA = strings.Repeat("ab", 32)

func TestValidateURL(t *testing.T) {
	const (
		ok      = ""
		invalid = "invalid" // wraps ErrInvalid
	)
	for _, c := range []struct {
		raw  string
		sha  string // goodSHA when empty, "-" for none
		rule string // ok, invalid or the rule refusing it
		want []string
	}{
		{raw: "http://code.example/x.py", rule: ok},
		{raw: "https://code.example:8443/x.py?v=1#f", rule: ok},
		{raw: "HTTPS://Code.Example./x", rule: ok},
		{raw: "http://93.184.216.34/x", rule: ok},
		{raw: "http://8.8.8.8:80/", rule: ok},
		{raw: "http://[2606:4700:4700::1111]/x", rule: ok},
		{raw: "http://[::ffff:8.8.8.8]/x", rule: ok},
		{raw: "http://[64:ff9b::808:808]/x", rule: ok},
		{raw: "http://1.2.3.4.5/", rule: ok}, // a DNS name: its addresses are checked when fetched
		{raw: "http://a-b.c0de.example/", rule: ok},

		// length, form
		{raw: "http://code.example/" + strings.Repeat("a", 2100), rule: "url_too_long", want: []string{"2048"}},
		{raw: "code.example/x", rule: invalid, want: []string{"absolute"}},
		{raw: "/x.py", rule: invalid},
		{raw: "http://[::1", rule: invalid, want: []string{"not a valid URL"}},
		{raw: "http://user:s3cretpw@[::1", rule: invalid},

		// schemes
		{raw: "ftp://code.example/x", rule: "scheme", want: []string{`"ftp"`}},
		{raw: "file:///etc/passwd", rule: "scheme", want: []string{`"file"`}},
		{raw: "gopher://code.example:70/_x", rule: "scheme", want: []string{`"gopher"`}},
		{raw: "data:text/plain,hello", rule: "scheme", want: []string{`"data"`}},
		{raw: "javascript:alert(1)", rule: "scheme"},
		{raw: "dict://code.example:11211/", rule: "scheme"},

		// credentials in the query (stored in the history otherwise)
		{raw: "https://code.example/x.py?token=s3cret", rule: "credentials_in_url", want: []string{`"token"`}},
		{raw: "https://code.example/x.py?v=2&X-Amz-Signature=abc", rule: "credentials_in_url", want: []string{`"X-Amz-Signature"`}},
		{raw: "https://code.example/x.py?API_KEY=abc", rule: "credentials_in_url"},
		{raw: "https://code.example/x.py?version=2&keyboard=1", rule: ok},

		// userinfo
		{raw: "http://user:s3cretpw@code.example/", rule: "userinfo"},
		{raw: "http://user@code.example/", rule: "userinfo"},
		{raw: "http://:s3cretpw@code.example/", rule: "userinfo"},
		{raw: "http://code.example@10.0.0.1/", rule: "userinfo"},

		// hosts
		{raw: "http:///x", rule: "bad_host", want: []string{"no host"}},
		{raw: "http:code.example", rule: "bad_host"},
		{raw: "http://:80/x", rule: "bad_host"},
		{raw: "http://a_b.example/", rule: "bad_host"},
		{raw: "http://a!b.example/", rule: "bad_host"},
		{raw: "http://a..b/", rule: "bad_host"},
		{raw: "http://.code.example/", rule: "bad_host"},
		{raw: "http://code.example../", rule: "bad_host"},
		{raw: "http://%C3%A9x.example/", rule: "bad_host"},
		{raw: "http://éx.example/", rule: "bad_host"},
		{raw: "http://[fe80::1%25eth0]/", rule: "bad_host", want: []string{"%"}},
		{raw: "http://[::1%2525]/", rule: "bad_host"},
		{raw: "http://" + strings.Repeat("a", 64) + ".example/", rule: "bad_host"},

		// literal IPv4 of each class
		{raw: "http://0.0.0.0/", rule: "address_class", want: []string{"unspecified", `"0.0.0.0"`}},
		{raw: "http://127.0.0.1:8080/", rule: "address_class", want: []string{"loopback", `"127.0.0.1"`}},
		{raw: "http://10.0.0.1/", rule: "address_class", want: []string{"private"}},
		{raw: "http://172.16.5.4/", rule: "address_class", want: []string{"private"}},
		{raw: "http://192.168.0.1/", rule: "address_class", want: []string{"private"}},
		{raw: "http://169.254.169.254/latest/meta-data/", rule: "address_class", want: []string{"metadata"}},
		// metadata services by name, refused before any DNS lookup
		{raw: "http://metadata.google.internal/computeMetadata/v1/", rule: "metadata_host", want: []string{`"metadata.google.internal"`}},
		{raw: "http://METADATA.google.internal./computeMetadata/v1/", rule: "metadata_host"},
		{raw: "http://metadata/computeMetadata/v1/", rule: "metadata_host"},
		{raw: "http://instance-data.ec2.internal/latest/", rule: "metadata_host"},
		{raw: "http://169.254.170.2/v2/credentials", rule: "address_class", want: []string{"metadata"}},
		{raw: "http://169.254.10.10/", rule: "address_class", want: []string{"link_local"}},
		{raw: "http://100.100.100.200/", rule: "address_class", want: []string{"cgnat"}},
		{raw: "http://192.0.0.1/", rule: "address_class", want: []string{"reserved"}},
		{raw: "http://192.0.2.1/", rule: "address_class", want: []string{"documentation"}},
		{raw: "http://198.51.100.1/", rule: "address_class", want: []string{"documentation"}},
		{raw: "http://203.0.113.1/", rule: "address_class", want: []string{"documentation"}},
		{raw: "http://198.18.0.1/", rule: "address_class", want: []string{"benchmarking"}},
		{raw: "http://192.88.99.1/", rule: "address_class", want: []string{"reserved"}},
		{raw: "http://224.0.0.1/", rule: "address_class", want: []string{"multicast"}},
		{raw: "http://240.0.0.1/", rule: "address_class", want: []string{"reserved"}},
		{raw: "http://255.255.255.255/", rule: "address_class", want: []string{"broadcast"}},

		// literal IPv6 of each class
		{raw: "http://[::]/", rule: "address_class", want: []string{"unspecified"}},
		{raw: "http://[::1]:8080/", rule: "address_class", want: []string{"loopback"}},
		{raw: "http://[::ffff:127.0.0.1]/", rule: "address_class", want: []string{"ipv4_mapped:loopback"}},
		{raw: "http://[::ffff:7f00:1]/", rule: "address_class", want: []string{"ipv4_mapped:loopback"}},
		{raw: "http://[::ffff:169.254.169.254]/", rule: "address_class", want: []string{"ipv4_mapped:metadata"}},
		{raw: "http://[64:ff9b::a00:1]/", rule: "address_class", want: []string{"nat64:private"}},
		{raw: "http://[64:ff9b:1::1]/", rule: "address_class", want: []string{"reserved"}},
		{raw: "http://[::a00:1]/", rule: "address_class", want: []string{"ipv4_compatible"}},
		{raw: "http://[100::1]/", rule: "address_class", want: []string{"discard"}},
		{raw: "http://[2001:db8::1]/", rule: "address_class", want: []string{"documentation"}},
		{raw: "http://[2001::1]/", rule: "address_class", want: []string{"transition"}},
		{raw: "http://[2002:7f00:1::1]/", rule: "address_class", want: []string{"transition"}},
		{raw: "http://[2001:100::1]/", rule: "address_class", want: []string{"reserved"}},
		{raw: "http://[fc00::1]/", rule: "address_class", want: []string{"unique_local"}},
		{raw: "http://[fd00:ec2::254]/", rule: "address_class", want: []string{"metadata"}},
		{raw: "http://[fe80::1]/", rule: "address_class", want: []string{"link_local"}},
		{raw: "http://[fec0::1]/", rule: "address_class", want: []string{"site_local"}},
		{raw: "http://[ff02::1]/", rule: "address_class", want: []string{"multicast"}},
		{raw: "http://[4000::1]/", rule: "address_class", want: []string{"reserved"}},

		// other spellings of IPv4 addresses
		{raw: "http://2130706433/", rule: "non_canonical_address", want: []string{`"2130706433"`}},
		{raw: "http://0x7f000001/", rule: "non_canonical_address"},
		{raw: "http://0X7F000001/", rule: "non_canonical_address"},
		{raw: "http://017700000001/", rule: "non_canonical_address"},
		{raw: "http://0177.0.0.1/", rule: "non_canonical_address"},
		{raw: "http://0x7f.0.0.1/", rule: "non_canonical_address"},
		{raw: "http://127.1/", rule: "non_canonical_address"},
		{raw: "http://127.0.1:80/", rule: "non_canonical_address"},
		{raw: "http://0x7f.1/", rule: "non_canonical_address"},
		{raw: "http://10.0.0.1./", rule: "non_canonical_address"},
		{raw: "http://127.0.0.1./", rule: "non_canonical_address"},
		{raw: "http://0/", rule: "non_canonical_address"},
		{raw: "http://0x/", rule: "non_canonical_address"},
		{raw: "http://8.8.8.8./", rule: "non_canonical_address"},      // public, still refused
		{raw: "http://134744072/", rule: "non_canonical_address"},     // 8.8.8.8
		{raw: "http://010.8.8.8/", rule: "non_canonical_address"},     // 8.8.8.8 in octal
		{raw: "http://169.254.43518/", rule: "non_canonical_address"}, // 169.254.169.254

		// sha256
		{raw: "http://code.example/x", sha: "-", rule: "unpinned", want: []string{"sha256"}},
		{raw: "http://code.example/x", sha: "ABC", rule: invalid, want: []string{"64 lowercase hex"}},
		{raw: "http://code.example/x", sha: strings.Repeat("A", 64), rule: invalid},
		{raw: "http://code.example/x", sha: strings.Repeat("a", 63), rule: invalid},
	} {
		sha := c.sha
		switch sha {
		case "":
			sha = goodSHA
		case "-":
			sha = ""
		}
		err := codesource.ValidateURL(c.raw, sha)
		name := c.raw
		if len(name) > 60 {
			name = name[:60] + "..."
		}
		t.Run(name, func(t *testing.T) {
			switch c.rule {
			case ok:
				if err != nil {
					t.Fatalf("ValidateURL(%q): %v", c.raw, err)
				}
			case invalid:
				wantInvalid(t, err, c.want...)
			default:
				wantRefusal(t, err, c.rule, c.want...)
			}
			// Never user information, never a URL longer than the cap.
			wantAbsent(t, err, "s3cretpw", strings.Repeat("a", 100))
		})
	}
}

func TestValidateURLUnpinned(t *testing.T) {
	p := codesource.Policy{AllowUnpinned: true}
	if err := p.ValidateURL("http://code.example/x", ""); err != nil {
		t.Errorf("unpinned with AllowUnpinned: %v", err)
	}
	if err := p.ValidateURL("http://code.example/x", goodSHA); err != nil {
		t.Errorf("pinned with AllowUnpinned: %v", err)
	}
	wantInvalid(t, p.ValidateURL("http://code.example/x", "not-a-sha"), "64 lowercase hex")
	wantRefusal(t, p.ValidateURL("http://10.0.0.1/x", ""), "address_class", "private")
	wantRefusal(t, codesource.Policy{}.ValidateURL("http://code.example/x", ""), "unpinned")
}

func TestValidateURLAllowedHosts(t *testing.T) {
	p := codesource.Policy{AllowedHosts: []string{"*.example.com", "code.example.org", "Upper.Example.NET.", "93.184.216.34", "10.0.0.1"}}
	for _, c := range []struct {
		raw     string
		allowed bool
	}{
		{"https://sub.example.com/x", true},
		{"https://a.b.example.com/x", true},
		{"https://SUB.Example.COM./x", true},
		{"https://example.com/x", false},
		{"https://evil-example.com/x", false},
		{"https://example.com.evil.org/x", false},
		{"https://sub.example.com.evil.org/x", false},
		{"https://code.example.org:8443/x", true},
		{"https://CODE.example.org./x", true},
		{"https://x.code.example.org/x", false},
		{"https://example.org/x", false},
		{"https://upper.example.net/x", true},
		{"http://93.184.216.34/x", true},
		{"http://8.8.8.8/x", false},
		{"http://[2606:4700::1111]/x", false},
	} {
		err := p.ValidateURL(c.raw, goodSHA)
		if c.allowed {
			if err != nil {
				t.Errorf("%s: %v", c.raw, err)
			}
			continue
		}
		wantRefusal(t, err, "host_not_allowed")
	}
	// The allowlist narrows; it never lifts the address rules.
	wantRefusal(t, p.ValidateURL("http://10.0.0.1/x", goodSHA), "address_class", "private")

	exact := codesource.Policy{AllowedHosts: []string{"example.com"}}
	for _, raw := range []string{"http://example.com/", "http://EXAMPLE.com./", "http://Example.Com:81/"} {
		if err := exact.ValidateURL(raw, goodSHA); err != nil {
			t.Errorf("%s: %v", raw, err)
		}
	}
	wantRefusal(t, exact.ValidateURL("http://sub.example.com/", goodSHA), "host_not_allowed", `"sub.example.com"`)
}

func TestValidateURLAllowLoopback(t *testing.T) {
	p := codesource.Policy{AllowLoopback: true}
	for _, raw := range []string{"http://127.0.0.1:8080/x", "http://127.3.2.1/x", "http://[::1]:8080/x"} {
		if err := p.ValidateURL(raw, goodSHA); err != nil {
			t.Errorf("%s: %v", raw, err)
		}
	}
	for _, c := range []struct{ raw, rule, class string }{
		{"http://10.0.0.1/", "address_class", "private"},
		{"http://169.254.169.254/", "address_class", "metadata"},
		{"http://0.0.0.0/", "address_class", "unspecified"},
		{"http://[::ffff:127.0.0.1]/", "address_class", "ipv4_mapped:loopback"},
		{"http://[64:ff9b::7f00:1]/", "address_class", "nat64:loopback"},
		{"http://127.1/", "non_canonical_address", ""},
		{"http://2130706433/", "non_canonical_address", ""},
		{"http://user:pw@127.0.0.1/", "userinfo", ""},
	} {
		wantRefusal(t, p.ValidateURL(c.raw, goodSHA), c.rule, c.class)
	}
}

func TestPolicyValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		p    codesource.Policy
		want []string // substrings of the error; none: valid
	}{
		{"zero", codesource.Policy{}, nil},
		{"good hosts", codesource.Policy{AllowedHosts: []string{"code.example.com", "*.example.com", "EXAMPLE.org.", "93.184.216.34"}}, nil},
		{"limits", codesource.Policy{MaxBytes: 1, Timeout: 1, MaxRedirects: 1}, nil},
		{"empty entry", codesource.Policy{AllowedHosts: []string{""}}, []string{`entry 0 ("")`, "empty"}},
		{"scheme", codesource.Policy{AllowedHosts: []string{"ok.example", "https://x.example"}}, []string{`entry 1 ("https://x.example")`, "scheme"}},
		{"port", codesource.Policy{AllowedHosts: []string{"x.example:443"}}, []string{`"x.example:443"`, "port"}},
		{"ipv6", codesource.Policy{AllowedHosts: []string{"[::1]"}}, []string{`"[::1]"`}},
		{"path", codesource.Policy{AllowedHosts: []string{"x.example/code"}}, []string{`"x.example/code"`, "path"}},
		{"lone star", codesource.Policy{AllowedHosts: []string{"*"}}, []string{`"*"`, "lone"}},
		{"star dot", codesource.Policy{AllowedHosts: []string{"*."}}, []string{`"*."`, "lone"}},
		{"inner star", codesource.Policy{AllowedHosts: []string{"a.*.example"}}, []string{`"a.*.example"`, "prefix"}},
		{"star no dot", codesource.Policy{AllowedHosts: []string{"*example.com"}}, []string{`"*example.com"`, "prefix"}},
		{"double star", codesource.Policy{AllowedHosts: []string{"*.*.example.com"}}, []string{`"*.*.example.com"`, "prefix"}},
		{"bad name", codesource.Policy{AllowedHosts: []string{"a b.example"}}, []string{`"a b.example"`, "not a valid host name"}},
		{"empty label", codesource.Policy{AllowedHosts: []string{"a..example"}}, []string{`"a..example"`}},
		{"non-canonical ip", codesource.Policy{AllowedHosts: []string{"127.1"}}, []string{`"127.1"`, "non-canonical"}},
		{"wildcard ip", codesource.Policy{AllowedHosts: []string{"*.1.2.3.4"}}, []string{`"*.1.2.3.4"`, "wildcard"}},
		{"negative bytes", codesource.Policy{MaxBytes: -1}, []string{"max bytes"}},
		{"negative timeout", codesource.Policy{Timeout: -1}, []string{"timeout"}},
		{"negative redirects", codesource.Policy{MaxRedirects: -1}, []string{"max redirects"}},
		{"several", codesource.Policy{AllowedHosts: []string{"*", "ok.example", "x:1"}, MaxRedirects: -2}, []string{`entry 0 ("*")`, `entry 2 ("x:1")`, "max redirects -2"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.p.Validate()
			if len(c.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v: want %q", err, w)
				}
			}
		})
	}
}

func TestValidateURLRejectsInvalidPolicy(t *testing.T) {
	p := codesource.Policy{AllowedHosts: []string{"*"}}
	if err := p.ValidateURL("http://code.example/", goodSHA); err == nil || !strings.Contains(err.Error(), "policy") {
		t.Errorf("invalid policy: %v", err)
	}
}
