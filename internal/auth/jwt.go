package auth

import (
	"context"
	"crypto/ed25519"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"

	"github.com/virtufin/workmanager/internal/tenant"
)

// JWTConfig configures JWT verification: keys from a JWKS URL or a PEM
// public key file (RSA, ECDSA or Ed25519), and the issuer and audience a
// token must carry. The role comes from the claim "role", the tenant from
// "tenant" (default: the default tenant), the subject from "sub".
type JWTConfig struct {
	JWKSURL       string // API_JWT_JWKS_URL
	PublicKeyFile string // API_JWT_PUBLIC_KEY_FILE
	Issuer        string // API_JWT_ISSUER (required)
	Audience      string // API_JWT_AUDIENCE (required)
}

// JWTVerifier verifies bearer JWTs.
type JWTVerifier struct {
	cfg     JWTConfig
	keyfunc jwt.Keyfunc
	parser  *jwt.Parser
}

// NewJWTVerifier loads the keys (a JWKS is fetched now and refreshed in
// the background until ctx ends).
func NewJWTVerifier(ctx context.Context, cfg JWTConfig) (*JWTVerifier, error) {
	if cfg.Issuer == "" || cfg.Audience == "" {
		return nil, errors.New("API_JWT_ISSUER and API_JWT_AUDIENCE are required with JWTs")
	}
	v := &JWTVerifier{cfg: cfg, parser: jwt.NewParser(
		jwt.WithValidMethods([]string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}),
		jwt.WithIssuer(cfg.Issuer), jwt.WithAudience(cfg.Audience), jwt.WithExpirationRequired(), jwt.WithLeeway(30*time.Second))}
	switch {
	case cfg.JWKSURL != "" && cfg.PublicKeyFile != "":
		return nil, errors.New("set one of API_JWT_JWKS_URL and API_JWT_PUBLIC_KEY_FILE, not both")
	case cfg.JWKSURL != "":
		k, err := keyfunc.NewDefaultCtx(ctx, []string{cfg.JWKSURL})
		if err != nil {
			return nil, fmt.Errorf("API_JWT_JWKS_URL: %w", err)
		}
		v.keyfunc = k.Keyfunc
	case cfg.PublicKeyFile != "":
		key, err := loadPublicKey(cfg.PublicKeyFile)
		if err != nil {
			return nil, err
		}
		v.keyfunc = func(*jwt.Token) (any, error) { return key, nil }
	default:
		return nil, errors.New("JWTs need API_JWT_JWKS_URL or API_JWT_PUBLIC_KEY_FILE")
	}
	return v, nil
}

func loadPublicKey(path string) (any, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("API_JWT_PUBLIC_KEY_FILE: %w", err)
	}
	if k, err := jwt.ParseRSAPublicKeyFromPEM(b); err == nil {
		return k, nil
	}
	if k, err := jwt.ParseECPublicKeyFromPEM(b); err == nil {
		return k, nil
	}
	if k, err := jwt.ParseEdPublicKeyFromPEM(b); err == nil {
		if ek, ok := k.(ed25519.PublicKey); ok {
			return ek, nil
		}
	}
	if blk, _ := pem.Decode(b); blk == nil {
		return nil, fmt.Errorf("API_JWT_PUBLIC_KEY_FILE %s: not PEM", path)
	}
	return nil, fmt.Errorf("API_JWT_PUBLIC_KEY_FILE %s: not an RSA, ECDSA or Ed25519 public key", path)
}

type claims struct {
	jwt.RegisteredClaims
	Role   string `json:"role"`
	Tenant string `json:"tenant"`
}

// Verify checks a token's signature, issuer, audience and expiry and
// returns its principal.
func (v *JWTVerifier) Verify(_ context.Context, token string) (Principal, error) {
	var c claims
	if _, err := v.parser.ParseWithClaims(token, &c, v.keyfunc); err != nil {
		return Principal{}, fmt.Errorf("the bearer JWT is not valid: %w", err)
	}
	role, err := ParseRole(c.Role)
	if err != nil {
		return Principal{}, fmt.Errorf("the bearer JWT's \"role\" claim: %w", err)
	}
	if c.Subject == "" {
		return Principal{}, errors.New("the bearer JWT has no \"sub\" claim")
	}
	t := c.Tenant
	if t == "" {
		t = DefaultTenant
	}
	if err := tenant.Validate(t); err != nil {
		return Principal{}, fmt.Errorf("the bearer JWT's \"tenant\" claim: %w", err)
	}
	return Principal{Subject: c.Subject, Role: role, Tenant: t, Via: "jwt"}, nil
}
