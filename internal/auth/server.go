package auth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
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
		if cfg.Tokens, err = LoadTokens(s.TokensFile); err != nil {
			return nil, nil, err
		}
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
		cert, err := tls.LoadX509KeyPair(s.TLSCertFile, s.TLSKeyFile)
		if err != nil {
			return nil, nil, fmt.Errorf("API_TLS_CERT_FILE / API_TLS_KEY_FILE: %w", err)
		}
		tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		if s.ClientCAFile != "" {
			pem, err := os.ReadFile(s.ClientCAFile)
			if err != nil {
				return nil, nil, fmt.Errorf("API_CLIENT_CA_FILE: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, nil, fmt.Errorf("API_CLIENT_CA_FILE %s: no PEM certificate in it", s.ClientCAFile)
			}
			// Callers with a bearer token need no certificate; one that is
			// presented must verify.
			tc.ClientCAs, tc.ClientAuth = pool, tls.VerifyClientCertIfGiven
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
