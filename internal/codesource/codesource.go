// Package codesource owns getting a worker's code from where the user said
// it is: inline bytes, or a URL whose body must match a given SHA-256. URL
// fetching is deliberately minimal (http/https, size and time limits); its
// hardening is tracked separately.
package codesource

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/virtufin/workmanager/internal/catalog"
)

// MaxSize bounds a code body.
const MaxSize = 16 << 20

var (
	// ErrInvalid: the source is malformed or its content does not match.
	ErrInvalid = errors.New("invalid code source")
)

// Fetcher downloads code from URLs.
type Fetcher struct {
	Client *http.Client
}

// ValidateURL checks a URL source before anything is fetched.
func ValidateURL(raw, sha string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%w: url %q must be an absolute http or https URL", ErrInvalid, raw)
	}
	if err := catalog.ValidateSHA256(sha); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return nil
}

// Fetch downloads raw and checks its SHA-256. Client errors (4xx, a wrong
// sha256, an oversized body) wrap ErrInvalid; network and 5xx errors do not,
// so callers may retry them.
func (f Fetcher) Fetch(ctx context.Context, raw, sha string) ([]byte, error) {
	if err := ValidateURL(raw, sha); err != nil {
		return nil, err
	}
	c := f.Client
	if c == nil {
		c = &http.Client{Timeout: 30 * time.Second}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, raw, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", raw, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 400 && resp.StatusCode < 500 {
		return nil, fmt.Errorf("%w: fetch %s: HTTP %d", ErrInvalid, raw, resp.StatusCode)
	}
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("fetch %s: HTTP %d", raw, resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", raw, err)
	}
	if len(body) > MaxSize {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrInvalid, raw, MaxSize)
	}
	if got := catalog.SHA256(body); got != sha {
		return nil, fmt.Errorf("%w: sha256 mismatch for %s: expected %s, got %s", ErrInvalid, raw, sha, got)
	}
	return body, nil
}
