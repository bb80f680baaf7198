package auth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/virtufin/workmanager/internal/credfile"
)

// Settings is the control API's authentication configuration.
type Settings struct {
	Off          bool   // API_AUTH=off
	TokensFile   string // API_TOKENS_FILE
	JWT          JWTConfig
	TLSCertFile  string // API_TLS_CERT_FILE
	TLSKeyFile   string // API_TLS_KEY_FILE
	ClientCAFile string // API_CLIENT_CA_FILE (mTLS)
	PublicHealth bool   // API_PUBLIC_HEALTH
	// ReloadInterval is how often the tokens file, the TLS certificate and
	// key and the client CA are checked for a change and read again
	// (CREDENTIALS_RELOAD_INTERVAL; 0: read once at start).
	ReloadInterval time.Duration
	// WrapCredentials, when set, wraps the server's transport credentials
	// (TLS, or plaintext when nil is passed): the API's transport adds its
	// per-method message guard there (api.Transport.Credentials).
	WrapCredentials func(credentials.TransportCredentials) credentials.TransportCredentials
}

// Validate checks the settings' shape (files are read by ServerOptions).
func (s Settings) Validate() error {
	switch {
	case (s.TLSCertFile == "") != (s.TLSKeyFile == ""):
		return errors.New("API_TLS_CERT_FILE and API_TLS_KEY_FILE go together")
	case s.ClientCAFile != "" && s.TLSCertFile == "":
		return errors.New("API_CLIENT_CA_FILE (client certificates) needs server TLS: API_TLS_CERT_FILE and API_TLS_KEY_FILE")
	case s.ReloadInterval < 0:
		return fmt.Errorf("CREDENTIALS_RELOAD_INTERVAL must not be negative (0 reads credentials once), got %s", s.ReloadInterval)
	case !s.Off && s.TokensFile == "" && s.ClientCAFile == "" && s.JWT == (JWTConfig{}):
		return errors.New("authentication is on (API_AUTH) but no method is configured: set API_TOKENS_FILE, API_JWT_* or API_CLIENT_CA_FILE, or API_AUTH=off to run without (never in production)")
	}
	return nil
}

// ServerOptions builds the gRPC server's options from s: TLS credentials
// (requesting client certificates when a client CA is set; wrapped by
// s.WrapCredentials), the authentication tap (TapHandle) and interceptors.
func ServerOptions(ctx context.Context, s Settings, log *slog.Logger) ([]grpc.ServerOption, *Authenticator, error) {
	cfg := Config{Off: s.Off, ClientCertificates: s.ClientCAFile != "", Log: log}
	if s.PublicHealth {
		cfg.PublicMethods = HealthAndReflection
	}
	var err error
	if s.TokensFile != "" {
		if cfg.Tokens, err = WatchTokens(s.TokensFile, s.ReloadInterval, log); err != nil {
			return nil, nil, err
		}
		go cfg.Tokens.Run(ctx)
	}
	if s.JWT != (JWTConfig{}) {
		if cfg.JWT, err = NewJWTVerifier(ctx, s.JWT); err != nil {
			return nil, nil, err
		}
	}
	a, err := New(cfg)
	if err != nil {
		return nil, nil, err
	}
	// The tap refuses what it can before any message is read; the
	// interceptors decide.
	opts := []grpc.ServerOption{grpc.InTapHandle(a.TapHandle()), grpc.ChainUnaryInterceptor(a.UnaryInterceptor()), grpc.ChainStreamInterceptor(a.StreamInterceptor())}
	var creds credentials.TransportCredentials // nil: plaintext
	if s.TLSCertFile != "" {
		tc, err := serverTLS(ctx, s, log)
		if err != nil {
			return nil, nil, err
		}
		creds = credentials.NewTLS(tc)
	}
	if s.WrapCredentials != nil {
		creds = s.WrapCredentials(creds)
	}
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	return opts, a, nil
}

// serverTLS is the server's TLS configuration: every handshake gets the
// certificate and client CAs the files hold now (read again when they
// change, every s.ReloadInterval), so a rotated Secret is served to new
// connections without a restart; established connections keep theirs.
func serverTLS(ctx context.Context, s Settings, log *slog.Logger) (*tls.Config, error) {
	pair, err := credfile.KeyPair("API_TLS_CERT_FILE", s.TLSCertFile, s.TLSKeyFile, s.ReloadInterval, log)
	if err != nil {
		return nil, err
	}
	go pair.Run(ctx)
	var cas *credfile.Watched[*x509.CertPool]
	if s.ClientCAFile != "" {
		if cas, err = credfile.CertPool("API_CLIENT_CA_FILE", s.ClientCAFile, s.ReloadInterval, log); err != nil {
			return nil, err
		}
		go cas.Run(ctx)
	}
	base := &tls.Config{MinVersion: tls.VersionTLS12}
	tc := base.Clone()
	tc.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := base.Clone()
		cert := pair.Get()
		c.Certificates = []tls.Certificate{cert}
		if cas != nil {
			// Callers with a bearer token need no certificate; one that
			// is presented must verify.
			c.ClientCAs, c.ClientAuth = cas.Get(), tls.VerifyClientCertIfGiven
		}
		return c, nil
	}
	return tc, nil
}
