// Package credfile holds credentials read from files (TLS certificates and
// keys, CA bundles, token and API-key files) and reads them again when the
// files' content changes, so that a rotated Kubernetes Secret takes effect
// without a restart. A file that no longer loads (half-written, a key that
// does not match its certificate) keeps the last good value and is logged
// as an error: a bad rotation never locks callers out.
package credfile

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultInterval is how often files are checked for a change when the
// setting (CREDENTIALS_RELOAD_INTERVAL) is not set.
const DefaultInterval = 30 * time.Second

// MaxFileBytes bounds every file read here: certificates, keys and token
// lists are a few KiB.
const MaxFileBytes = 1 << 20

// Watched is a value loaded from files, swapped atomically when the files'
// content changes. Get is safe for concurrent use and never blocks on a
// reload.
type Watched[T any] struct {
	name     string
	files    []string
	load     func() (T, error)
	interval time.Duration
	log      *slog.Logger
	now      func() time.Time

	cur       atomic.Pointer[T]
	mu        sync.Mutex // held by the one caller checking the files
	hash      [sha256.Size]byte
	tried     [sha256.Size]byte // the content last loaded, well or not
	checked   time.Time
	checkedAt atomic.Int64 // checked, read without the lock
	lastErr   atomic.Pointer[error]
	reloads   atomic.Int64
}

// New loads the value from files with load (an error when it fails: a
// process must not start without its credentials) and returns it watched:
// files are checked again at most every interval (0: never, the value read
// now is kept). name says what the files are in log lines, such as
// "API_TOKENS_FILE".
func New[T any](name string, files []string, interval time.Duration, log *slog.Logger, load func() (T, error)) (*Watched[T], error) {
	if interval < 0 {
		return nil, fmt.Errorf("%s: the reload interval must not be negative, got %s", name, interval)
	}
	if log == nil {
		log = slog.Default()
	}
	w := &Watched[T]{name: name, files: files, load: load, interval: interval, log: log, now: time.Now}
	h, err := w.contentHash()
	if err != nil {
		return nil, err
	}
	v, err := load()
	if err != nil {
		return nil, err
	}
	w.cur.Store(&v)
	w.hash, w.tried, w.checked = h, h, w.now()
	w.checkedAt.Store(w.checked.UnixNano())
	return w, nil
}

// Get returns the current value, checking the files first when an
// interval passed since the last check (one caller checks, the others
// wait for it: a few KiB read once an interval).
func (w *Watched[T]) Get() T {
	if w.interval > 0 && w.now().UnixNano()-w.checkedAt.Load() >= int64(w.interval) {
		w.mu.Lock()
		if w.now().Sub(w.checked) >= w.interval {
			w.checkLocked()
		}
		w.mu.Unlock()
	}
	return *w.cur.Load()
}

// Check reads the files now and loads them again when their content
// changed. It reports whether the value changed, and the error of a
// failed load (the last good value is kept).
func (w *Watched[T]) Check() (bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.checkLocked()
}

func (w *Watched[T]) checkLocked() (bool, error) {
	w.checked = w.now()
	w.checkedAt.Store(w.checked.UnixNano())
	h, err := w.contentHash()
	if err != nil {
		return w.failed(h, err)
	}
	if h == w.hash || h == w.tried {
		// Unchanged, or the same bad content already logged.
		if h == w.hash {
			w.tried = h
			w.lastErr.Store(nil)
		}
		return false, w.Err()
	}
	v, err := w.load()
	if err != nil {
		return w.failed(h, err)
	}
	w.cur.Store(&v)
	w.hash, w.tried = h, h
	w.lastErr.Store(nil)
	w.reloads.Add(1)
	w.log.Info("credentials reloaded", "what", w.name, "files", w.files)
	return true, nil
}

func (w *Watched[T]) failed(h [sha256.Size]byte, err error) (bool, error) {
	prev := w.lastErr.Load()
	w.lastErr.Store(&err)
	if h != w.tried || prev == nil {
		w.log.Error("CREDENTIALS NOT RELOADED: the changed files do not load; the previous credentials stay in use until they are fixed",
			"what", w.name, "files", w.files, "err", err)
	}
	w.tried = h
	return false, err
}

// Err is the error of the last check when the files did not load (nil
// when the value in use is what the files hold).
func (w *Watched[T]) Err() error {
	if p := w.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Reloads counts the values loaded after the first.
func (w *Watched[T]) Reloads() int64 { return w.reloads.Load() }

// Run checks the files every interval (at least every second) until ctx
// ends, so that a rotation is logged (and takes effect) even while nothing
// calls Get. It returns at once when the interval is 0.
func (w *Watched[T]) Run(ctx context.Context) {
	if w.interval <= 0 {
		return
	}
	t := time.NewTicker(max(w.interval, time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_, _ = w.Check()
		}
	}
}

// contentHash hashes every file's content (a missing file is an error).
func (w *Watched[T]) contentHash() ([sha256.Size]byte, error) {
	h := sha256.New()
	for _, f := range w.files {
		b, err := ReadLimited(w.name, f)
		if err != nil {
			return [sha256.Size]byte{}, err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", f, len(b))
		h.Write(b)
	}
	var out [sha256.Size]byte
	copy(out[:], h.Sum(nil))
	return out, nil
}

// ReadLimited reads path, refusing files over MaxFileBytes; errors name
// setting and path.
func ReadLimited(setting, path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", setting, path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", setting, path, err)
	}
	if len(b) > MaxFileBytes {
		return nil, fmt.Errorf("%s %s: more than the %d bytes a certificate, key or token list needs", setting, path, MaxFileBytes)
	}
	return b, nil
}

// KeyPair watches a PEM certificate and its key (setting names the
// certificate's setting in errors, such as "API_TLS_CERT_FILE").
func KeyPair(setting, certFile, keyFile string, interval time.Duration, log *slog.Logger) (*Watched[tls.Certificate], error) {
	return New(setting, []string{certFile, keyFile}, interval, log, func() (tls.Certificate, error) {
		return LoadKeyPair(setting, certFile, keyFile)
	})
}

// LoadKeyPair reads a PEM certificate and its key once.
func LoadKeyPair(setting, certFile, keyFile string) (tls.Certificate, error) {
	cert, err := ReadLimited(setting, certFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	key, err := ReadLimited(setting, keyFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	pair, err := tls.X509KeyPair(cert, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%s %s and its key %s: %w", setting, certFile, keyFile, err)
	}
	return pair, nil
}

// CertPool watches a PEM CA bundle (setting names it in errors).
func CertPool(setting, file string, interval time.Duration, log *slog.Logger) (*Watched[*x509.CertPool], error) {
	return New(setting, []string{file}, interval, log, func() (*x509.CertPool, error) { return LoadCertPool(setting, file) })
}

// LoadCertPool reads a PEM CA bundle once.
func LoadCertPool(setting, file string) (*x509.CertPool, error) {
	b, err := ReadLimited(setting, file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s %s: no PEM certificate in it", setting, file)
	}
	return pool, nil
}
