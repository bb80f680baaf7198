package codesource_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/codesource"
)

var code = []byte("def process(e): pass\n")

// The public addresses the fake resolver hands out; DialAddr routes them
// to the test server.
const (
	publicIP  = "93.184.216.34"
	publicIP2 = "93.184.216.35"
)

// resolver answers from a table; a host with several answers in turn
// (rebinding) gets the next one on each lookup, the last one for good.
type resolver struct {
	mu      sync.Mutex
	answers map[string][][]string
	lookups map[string]int
}

func (r *resolver) LookupIPAddr(_ context.Context, host string) ([]net.IPAddr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	seq, ok := r.answers[strings.TrimSuffix(strings.ToLower(host), ".")]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, Server: "10.255.255.53:53", IsNotFound: true}
	}
	if r.lookups == nil {
		r.lookups = map[string]int{}
	}
	n := min(r.lookups[host], len(seq)-1)
	r.lookups[host]++
	var out []net.IPAddr
	for _, s := range seq[n] {
		// 16-byte IPv4 answers, as Go's own resolver returns them.
		out = append(out, net.IPAddr{IP: net.ParseIP(s)})
	}
	return out, nil
}

// testServer is a loopback server the fetcher reaches as code.example.
type testServer struct {
	*httptest.Server
	port   string
	mu     sync.Mutex
	dialed []string
}

func newTestServer(t *testing.T) *testServer {
	ts := &testServer{}
	mux := http.NewServeMux()
	redirect := func(path, to string) {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, strings.ReplaceAll(to, "PORT", ts.port), http.StatusFound)
		})
	}
	mux.HandleFunc("/ok", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(code) })
	mux.HandleFunc("/big-length", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "200")
		_, _ = w.Write(make([]byte, 200))
	})
	mux.HandleFunc("/big-chunked", func(w http.ResponseWriter, r *http.Request) {
		for range 3 {
			_, _ = w.Write(make([]byte, 50))
			w.(http.Flusher).Flush()
		}
	})
	mux.HandleFunc("/exact", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(make([]byte, 100)) })
	mux.HandleFunc("/404", http.NotFound)
	mux.HandleFunc("/503", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	mux.HandleFunc("/hops/{n}", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.PathValue("n"))
		if n == 0 {
			_, _ = w.Write(code)
			return
		}
		http.Redirect(w, r, fmt.Sprintf("/hops/%d", n-1), http.StatusFound)
	})
	redirect("/to-public", "http://other.example/ok")
	redirect("/to-loopback", "http://127.0.0.1:PORT/ok")
	redirect("/to-localhost", "http://localhost.example:PORT/ok")
	redirect("/to-mapped", "http://[::ffff:127.0.0.1]:PORT/ok")
	redirect("/to-metadata", "http://169.254.169.254/latest/meta-data/")
	redirect("/to-internal", "http://internal.example/ok")
	redirect("/to-decimal", "http://2130706433:PORT/ok")
	redirect("/to-ftp", "ftp://code.example/ok")
	redirect("/to-userinfo", "http://user:s3cretpw@code.example/ok")
	redirect("/to-self", "http://code.example/ok")
	redirect("/to-outside", "http://outside.example/ok")
	ts.Server = httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	_, ts.port, _ = net.SplitHostPort(ts.Listener.Addr().String())
	return ts
}

// dial routes the public test addresses to the server and records every
// address it was asked for: none may be anything but public.
func (ts *testServer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	ts.mu.Lock()
	ts.dialed = append(ts.dialed, addr)
	ts.mu.Unlock()
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, err
	}
	if c := codesource.Classify(ap.Addr()); c != "" {
		return nil, fmt.Errorf("test dialer: asked for a %s address", c)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, ts.Listener.Addr().String())
}

func (ts *testServer) fetcher(p codesource.Policy, r *resolver) *codesource.Fetcher {
	return &codesource.Fetcher{Policy: p, Resolver: r, DialAddr: ts.dial}
}

func stdResolver() *resolver {
	return &resolver{answers: map[string][][]string{
		"code.example":     {{publicIP}},
		"other.example":    {{publicIP2}},
		"internal.example": {{"10.0.0.5"}},
		"multi.example":    {{publicIP, "10.0.0.7"}},
		"meta.example":     {{"169.254.169.254"}},
		"v6.example":       {{"2606:4700::1111"}},
		"v6meta.example":   {{"fd00:ec2::254"}},
		"mapped.example":   {{"::ffff:127.0.0.1"}},
		"outside.example":  {{publicIP2}},
	}}
}

func TestFetch(t *testing.T) {
	ts := newTestServer(t)
	sha := catalog.SHA256(code)
	ctx := context.Background()
	fetch := func(p codesource.Policy, path, sha string) ([]byte, error) {
		return ts.fetcher(p, stdResolver()).Fetch(ctx, path, sha)
	}

	t.Run("pinned fetch end to end", func(t *testing.T) {
		for _, u := range []string{"http://code.example/ok", "http://CODE.example./ok", "http://code.example:8080/ok", "http://v6.example/ok", "http://93.184.216.34/ok"} {
			got, err := fetch(codesource.Policy{}, u, sha)
			if err != nil || string(got) != string(code) {
				t.Errorf("%s: %q, %v", u, got, err)
			}
		}
	})
	t.Run("unpinned", func(t *testing.T) {
		got, err := fetch(codesource.Policy{AllowUnpinned: true}, "http://code.example/ok", "")
		if err != nil || string(got) != string(code) {
			t.Errorf("%q, %v", got, err)
		}
		_, err = fetch(codesource.Policy{}, "http://code.example/ok", "")
		wantRefusal(t, err, "unpinned")
	})
	t.Run("public redirect", func(t *testing.T) {
		got, err := fetch(codesource.Policy{}, "http://code.example/to-public", sha)
		if err != nil || string(got) != string(code) {
			t.Errorf("%q, %v", got, err)
		}
	})

	for _, c := range []struct {
		name, url string
		policy    codesource.Policy
		rule      string
		want      []string // in the message
		absent    []string // not in the message
	}{
		// literal addresses: refused before any connection
		{name: "literal loopback", url: "http://127.0.0.1:PORT/ok", rule: "address_class", want: []string{"loopback"}},
		{name: "literal metadata", url: "http://169.254.169.254/", rule: "address_class", want: []string{"metadata"}},
		{name: "decimal", url: "http://2130706433:PORT/ok", rule: "non_canonical_address"},
		// resolved addresses
		{name: "resolves private", url: "http://internal.example/ok", rule: "address_class",
			want: []string{`"internal.example"`, "private"}, absent: []string{"10.0.0.5"}},
		{name: "resolves metadata", url: "http://meta.example/ok", rule: "address_class",
			want: []string{`"meta.example"`, "metadata"}, absent: []string{"169.254"}},
		{name: "resolves v6 metadata", url: "http://v6meta.example/ok", rule: "address_class",
			want: []string{"metadata"}, absent: []string{"fd00"}},
		{name: "resolves mapped loopback", url: "http://mapped.example/ok", rule: "address_class",
			want: []string{"loopback"}, absent: []string{"127.0.0.1"}},
		{name: "one of two A records private", url: "http://multi.example/ok", rule: "address_class",
			want: []string{`"multi.example"`, "private"}, absent: []string{"10.0.0.7", publicIP}},
		// redirects
		{name: "redirect to loopback literal", url: "http://code.example/to-loopback", rule: "redirect",
			want: []string{"a redirect was refused (address_class: loopback)"}, absent: []string{"127.0.0.1"}},
		{name: "redirect to mapped loopback", url: "http://code.example/to-mapped", rule: "redirect",
			want: []string{"address_class: ipv4_mapped:loopback"}, absent: []string{"127.0.0.1"}},
		{name: "redirect to metadata", url: "http://code.example/to-metadata", rule: "redirect",
			want: []string{"address_class: metadata"}, absent: []string{"169.254", "meta-data"}},
		{name: "redirect to name resolving private", url: "http://code.example/to-internal", rule: "redirect",
			want: []string{"a redirect was refused (address_class: private)"}, absent: []string{"internal.example", "10.0.0.5"}},
		{name: "redirect to decimal", url: "http://code.example/to-decimal", rule: "redirect",
			want: []string{"(non_canonical_address)"}, absent: []string{"2130706433"}},
		{name: "redirect to ftp", url: "http://code.example/to-ftp", rule: "redirect", want: []string{"(scheme)"}},
		{name: "redirect with userinfo", url: "http://code.example/to-userinfo", rule: "redirect",
			want: []string{"(userinfo)"}, absent: []string{"s3cretpw", "user:"}},
		{name: "redirect outside the allowlist", url: "http://code.example/to-outside", rule: "redirect",
			policy: codesource.Policy{AllowedHosts: []string{"code.example"}},
			want:   []string{"(host_not_allowed)"}, absent: []string{"outside.example"}},
		{name: "too many redirects", url: "http://code.example/hops/6", rule: "too_many_redirects", want: []string{"5"}},
		{name: "too many redirects custom", url: "http://code.example/hops/3", rule: "too_many_redirects",
			policy: codesource.Policy{MaxRedirects: 2}, want: []string{"2"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := fetch(c.policy, strings.ReplaceAll(c.url, "PORT", ts.port), sha)
			wantRefusal(t, err, c.rule, c.want...)
			wantAbsent(t, err, c.absent...)
		})
	}

	t.Run("redirect chain within the limit", func(t *testing.T) {
		for _, c := range []struct {
			p    codesource.Policy
			hops int
		}{{codesource.Policy{}, 5}, {codesource.Policy{MaxRedirects: 2}, 2}, {codesource.Policy{MaxRedirects: 1}, 1}} {
			if _, err := fetch(c.p, fmt.Sprintf("http://code.example/hops/%d", c.hops), sha); err != nil {
				t.Errorf("%d hops under max %d: %v", c.hops, c.p.MaxRedirects, err)
			}
		}
	})

	t.Run("oversized", func(t *testing.T) {
		p := codesource.Policy{MaxBytes: 100, AllowUnpinned: true}
		for _, path := range []string{"/big-length", "/big-chunked"} {
			_, err := fetch(p, "http://code.example"+path, "")
			wantInvalid(t, err, "larger than 100 bytes")
		}
		if got, err := fetch(p, "http://code.example/exact", ""); err != nil || len(got) != 100 {
			t.Errorf("exactly the cap: %d bytes, %v", len(got), err)
		}
	})
	t.Run("sha256 mismatch", func(t *testing.T) {
		other := strings.Repeat("0", 64)
		_, err := fetch(codesource.Policy{}, "http://code.example/ok", other)
		wantInvalid(t, err, "sha256 mismatch for http://code.example/ok: expected "+other)
		wantAbsent(t, err, sha)
	})
	t.Run("status", func(t *testing.T) {
		_, err := fetch(codesource.Policy{}, "http://code.example/404", sha)
		wantInvalid(t, err, "fetch of http://code.example/404 failed: HTTP 404")
		_, err = fetch(codesource.Policy{}, "http://code.example/503", sha)
		wantRetryable(t, err, "HTTP 503")
	})
	t.Run("timeout", func(t *testing.T) {
		start := time.Now()
		_, err := fetch(codesource.Policy{Timeout: 200 * time.Millisecond}, "http://code.example/slow", sha)
		wantRetryable(t, err, "fetch of http://code.example/slow failed")
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("took %v", d)
		}
	})
	t.Run("resolver failure", func(t *testing.T) {
		_, err := fetch(codesource.Policy{}, "http://nowhere.example/ok", sha)
		// No such host is the caller's mistake: invalid, not retried.
		wantInvalid(t, err, `host "nowhere.example" of code.url does not resolve (no such host)`)
		wantAbsent(t, err, "10.255.255.53")
		var dnsErr *net.DNSError
		if !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
			t.Errorf("%v: the DNS error is not in the chain", err)
		}
	})
	t.Run("connection failure names no address", func(t *testing.T) {
		f := &codesource.Fetcher{Resolver: stdResolver(), DialAddr: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("connection refused")}
		}}
		_, err := f.Fetch(ctx, "http://code.example/ok", sha)
		wantRetryable(t, err, `connecting to "code.example" failed: connection refused`)
		wantAbsent(t, err, publicIP)
	})
	t.Run("invalid policy", func(t *testing.T) {
		_, err := fetch(codesource.Policy{MaxBytes: -1}, "http://code.example/ok", sha)
		if err == nil || !strings.Contains(err.Error(), "max bytes") {
			t.Errorf("%v", err)
		}
	})

	ts.mu.Lock()
	defer ts.mu.Unlock()
	for _, a := range ts.dialed {
		if ap := netip.MustParseAddrPort(a); codesource.Classify(ap.Addr()) != "" {
			t.Errorf("dialed %s", a)
		}
	}
}

// A resolver that answers public first and the metadata address after:
// the first fetch connects to the checked public address; every later
// lookup, by a new fetch or a redirect back to the same name, is refused.
func TestFetchDNSRebinding(t *testing.T) {
	ts := newTestServer(t)
	sha := catalog.SHA256(code)
	ctx := context.Background()
	rebind := func() *resolver {
		return &resolver{answers: map[string][][]string{"code.example": {{publicIP}, {"169.254.169.254"}}}}
	}

	r := rebind()
	f := ts.fetcher(codesource.Policy{}, r)
	if got, err := f.Fetch(ctx, "http://code.example/ok", sha); err != nil || string(got) != string(code) {
		t.Fatalf("first fetch: %q, %v", got, err)
	}
	_, err := f.Fetch(ctx, "http://code.example/ok", sha)
	wantRefusal(t, err, "address_class", `an address of "code.example" is metadata`)
	wantAbsent(t, err, "169.254")

	_, err = ts.fetcher(codesource.Policy{}, rebind()).Fetch(ctx, "http://code.example/to-self", sha)
	wantRefusal(t, err, "address_class", `"code.example"`, "metadata")
	wantAbsent(t, err, "169.254")

	for _, a := range ts.dialed {
		if !strings.HasPrefix(a, publicIP+":") {
			t.Errorf("dialed %s", a)
		}
	}
}

// With AllowLoopback the fetcher reaches a loopback server with its real
// dialer (no DialAddr), directly or through a name; nothing else opens.
func TestFetchAllowLoopback(t *testing.T) {
	ts := newTestServer(t)
	sha := catalog.SHA256(code)
	ctx := context.Background()
	r := stdResolver()
	r.answers["localhost.example"] = [][]string{{"127.0.0.1"}}
	f := &codesource.Fetcher{Policy: codesource.Policy{AllowLoopback: true}, Resolver: r}

	for _, u := range []string{ts.URL + "/ok", "http://localhost.example:" + ts.port + "/ok", ts.URL + "/to-loopback", ts.URL + "/to-localhost"} {
		if got, err := f.Fetch(ctx, u, sha); err != nil || string(got) != string(code) {
			t.Errorf("%s: %q, %v", u, got, err)
		}
	}
	for _, c := range []struct{ url, rule, class string }{
		{"http://10.0.0.1/ok", "address_class", "private"},
		{"http://169.254.169.254/latest/meta-data/", "address_class", "metadata"},
		{"http://internal.example/ok", "address_class", "private"},
		{"http://meta.example/ok", "address_class", "metadata"},
		{"http://[::ffff:127.0.0.1]:" + ts.port + "/ok", "address_class", "ipv4_mapped:loopback"},
		{ts.URL + "/to-metadata", "redirect", "address_class: metadata"},
		{ts.URL + "/to-internal", "redirect", "address_class: private"},
		{ts.URL + "/to-mapped", "redirect", "address_class: ipv4_mapped:loopback"},
	} {
		_, err := f.Fetch(ctx, c.url, sha)
		wantRefusal(t, err, c.rule, c.class)
	}
	// Without AllowLoopback, the same server is out of reach.
	_, err := (&codesource.Fetcher{Resolver: r}).Fetch(ctx, ts.URL+"/ok", sha)
	wantRefusal(t, err, "address_class", "loopback")
	_, err = (&codesource.Fetcher{Resolver: r}).Fetch(ctx, "http://localhost.example:"+ts.port+"/ok", sha)
	wantRefusal(t, err, "address_class", `"localhost.example"`, "loopback")
	wantAbsent(t, err, "127.0.0.1")
}

// The Control hook refuses what reaches the socket, wrapped in a
// net.OpError by the dialer; errors.As still finds the Refusal.
func TestDialControlThroughDialer(t *testing.T) {
	ts := newTestServer(t)
	d := net.Dialer{Timeout: time.Second, Control: codesource.DialControl(codesource.Policy{})}
	c, err := d.DialContext(context.Background(), "tcp", ts.Listener.Addr().String())
	if err == nil {
		c.Close()
		t.Fatal("the control hook let a loopback connection through")
	}
	var op *net.OpError
	if !errors.As(err, &op) {
		t.Errorf("%v: not a net.OpError", err)
	}
	var r *codesource.Refusal
	if !errors.As(err, &r) || r.Rule != "address_class" || !errors.Is(err, codesource.ErrForbidden) {
		t.Fatalf("%v: want an address_class refusal", err)
	}
	d.Control = codesource.DialControl(codesource.Policy{AllowLoopback: true})
	c, err = d.DialContext(context.Background(), "tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatalf("AllowLoopback: %v", err)
	}
	c.Close()
}

// The old API keeps compiling: a Fetcher value in a struct field.
func TestFetcherValueField(t *testing.T) {
	var holder struct{ Fetcher codesource.Fetcher }
	_, err := holder.Fetcher.Fetch(context.Background(), "http://10.0.0.1/x", goodSHA)
	wantRefusal(t, err, "address_class", "private")
}
