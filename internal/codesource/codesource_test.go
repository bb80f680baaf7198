package codesource

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/virtufin/workmanager/internal/catalog"
)

func TestFetch(t *testing.T) {
	body := []byte("def process(e): pass\n")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			_, _ = w.Write(body)
		case "/down":
			w.WriteHeader(http.StatusBadGateway)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	sha := catalog.SHA256(body)
	if got, err := (Fetcher{}).Fetch(ctx, srv.URL+"/ok", sha); err != nil || string(got) != string(body) {
		t.Fatalf("fetch: %v", err)
	}
	for _, c := range []struct {
		url, sha, want string
		invalid        bool
	}{
		{srv.URL + "/ok", strings.Repeat("0", 64), "sha256 mismatch", true},
		{srv.URL + "/missing", sha, "HTTP 404", true},
		{srv.URL + "/down", sha, "HTTP 502", false},
		{"ftp://x/y", sha, "http or https", true},
		{srv.URL + "/ok", "ABC", "64 lowercase hex", true},
	} {
		_, err := (Fetcher{}).Fetch(ctx, c.url, c.sha)
		if err == nil || !strings.Contains(err.Error(), c.want) || errors.Is(err, ErrInvalid) != c.invalid {
			t.Errorf("Fetch(%s): %v, want %q (invalid=%v)", c.url, err, c.want, c.invalid)
		}
	}
}
