// Package envconfig reads typed settings from the environment for the
// commands' config structs: each getter returns the variable's value, or the
// default when it is unset or empty, and the first bad value is kept as an
// error that names the variable (`WORKER_TIMEOUT="x": time: invalid
// duration "x"`). Validation of the values stays with each command's
// config.validate.
package envconfig

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/virtufin/workmanager/internal/codesource"
	"github.com/virtufin/workmanager/internal/redischeck"
	"github.com/virtufin/workmanager/internal/temporalconn"
)

// Reader reads variables; Err reports the first that could not be parsed.
type Reader struct {
	lookup func(string) (string, bool)
	err    error
}

// New reads the process environment.
func New() *Reader { return &Reader{lookup: os.LookupEnv} }

// FromMap reads m (tests).
func FromMap(m map[string]string) *Reader {
	return &Reader{lookup: func(k string) (string, bool) { v, ok := m[k]; return v, ok }}
}

// Err is the first parse error, or nil.
func (r *Reader) Err() error { return r.err }

func (r *Reader) raw(name string) (string, bool) {
	v, ok := r.lookup(name)
	return v, ok && v != ""
}

func parse[T any](r *Reader, name string, def T, f func(string) (T, error)) T {
	v, ok := r.raw(name)
	if !ok {
		return def
	}
	x, err := f(v)
	if err != nil {
		if r.err == nil {
			r.err = fmt.Errorf("%s=%q: %w", name, v, err)
		}
		return def
	}
	return x
}

// String returns the variable, or def.
func (r *Reader) String(name, def string) string {
	if v, ok := r.raw(name); ok {
		return v
	}
	return def
}

// Int returns the variable as an integer, or def.
func (r *Reader) Int(name string, def int) int { return parse(r, name, def, strconv.Atoi) }

// Float returns the variable as a number, or def.
func (r *Reader) Float(name string, def float64) float64 {
	return parse(r, name, def, func(s string) (float64, error) { return strconv.ParseFloat(s, 64) })
}

// Bool returns the variable as a boolean (strconv.ParseBool), or def.
func (r *Reader) Bool(name string, def bool) bool { return parse(r, name, def, strconv.ParseBool) }

// Duration returns the variable as a Go duration ("30s"), or def.
func (r *Reader) Duration(name string, def time.Duration) time.Duration {
	return parse(r, name, def, time.ParseDuration)
}

// LogLevel returns the variable as a slog level ("debug", "warn", …), or
// info.
func (r *Reader) LogLevel(name string) slog.Level {
	return parse(r, name, slog.LevelInfo, func(v string) (slog.Level, error) {
		var l slog.Level
		return l, l.UnmarshalText([]byte(v))
	})
}

// Services are the servers every command talks to.
type Services struct {
	TemporalAddress   string // TEMPORAL_ADDRESS
	TemporalNamespace string // TEMPORAL_NAMESPACE
	DaprGRPCAddress   string // DAPR_GRPC_ADDRESS
	StateStore        string // DAPR_STATESTORE
	DaprAPIToken      string // DAPR_API_TOKEN: daprd's API token, sent on every call when set
	// Temporal is how the frontend is reached beyond plain gRPC: TLS,
	// mTLS, API key (TEMPORAL_TLS, TEMPORAL_TLS_CA_FILE,
	// TEMPORAL_TLS_CERT_FILE, TEMPORAL_TLS_KEY_FILE,
	// TEMPORAL_TLS_SERVER_NAME, TEMPORAL_API_KEY_FILE), and how requests
	// are compressed (TEMPORAL_GRPC_COMPRESSION).
	Temporal temporalconn.Settings
	// RedisCheck is the state store's Redis, which the command asks for
	// its eviction policy and persistence (internal/redischeck):
	// REDIS_CHECK_ADDR (empty: not checked), REDIS_CHECK_USERNAME,
	// REDIS_CHECK_PASSWORD_FILE, REDIS_CHECK_TLS.
	RedisCheck redischeck.Settings
}

// Services reads the server addresses, defaulting to make run's.
func (r *Reader) Services() Services {
	return Services{
		TemporalAddress:   r.String("TEMPORAL_ADDRESS", "127.0.0.1:7233"),
		TemporalNamespace: r.String("TEMPORAL_NAMESPACE", "default"),
		DaprGRPCAddress:   r.String("DAPR_GRPC_ADDRESS", "127.0.0.1:50001"),
		StateStore:        r.String("DAPR_STATESTORE", "statestore"),
		DaprAPIToken:      r.String("DAPR_API_TOKEN", ""),
		Temporal: temporalconn.Settings{
			TLS:         r.Bool("TEMPORAL_TLS", false),
			CAFile:      r.String("TEMPORAL_TLS_CA_FILE", ""),
			CertFile:    r.String("TEMPORAL_TLS_CERT_FILE", ""),
			KeyFile:     r.String("TEMPORAL_TLS_KEY_FILE", ""),
			ServerName:  r.String("TEMPORAL_TLS_SERVER_NAME", ""),
			APIKeyFile:  r.String("TEMPORAL_API_KEY_FILE", ""),
			Compression: r.String("TEMPORAL_GRPC_COMPRESSION", temporalconn.CompressionNone),
		},
		RedisCheck: redischeck.Settings{
			Addr:         r.String("REDIS_CHECK_ADDR", ""),
			Username:     r.String("REDIS_CHECK_USERNAME", ""),
			PasswordFile: r.String("REDIS_CHECK_PASSWORD_FILE", ""),
			TLS:          r.Bool("REDIS_CHECK_TLS", false),
		},
	}
}

// List returns the variable split at sep, items trimmed, empty ones
// dropped (nil when unset).
func (r *Reader) List(name, sep string) []string {
	var out []string
	for _, p := range strings.Split(r.String(name, ""), sep) {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// CodeURLs reads the rules for URL code sources (docs/security.md), which
// the API checks at CreateWorker/LoadCode and the nodes apply when they
// fetch: CODE_URL_ALLOWED_HOSTS, CODE_URL_ALLOW_UNPINNED,
// CODE_URL_MAX_BYTES, CODE_URL_TIMEOUT and, for tests only,
// CODE_URL_TEST_ALLOW_LOOPBACK.
func (r *Reader) CodeURLs() codesource.Policy {
	return codesource.Policy{
		AllowedHosts:  r.List("CODE_URL_ALLOWED_HOSTS", ","),
		AllowUnpinned: r.Bool("CODE_URL_ALLOW_UNPINNED", false),
		AllowLoopback: r.Bool("CODE_URL_TEST_ALLOW_LOOPBACK", false),
		MaxBytes:      int64(r.Int("CODE_URL_MAX_BYTES", codesource.MaxSize)),
		Timeout:       r.Duration("CODE_URL_TIMEOUT", codesource.DefaultTimeout),
	}
}
