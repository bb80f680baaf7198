package auth

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"

	"github.com/virtufin/workmanager/internal/tenant"
)

// JWTConfig configures JWT verification: keys from a JWKS URL or a PEM
// public key file (RSA, ECDSA or Ed25519), and the issuer and audience a
// token must carry. The role comes from the claim "role", the tenant from
// "tenant" (required: "default" names the default tenant), the subject
// from "sub".
type JWTConfig struct {
	JWKSURL       string // API_JWT_JWKS_URL
	PublicKeyFile string // API_JWT_PUBLIC_KEY_FILE
	Issuer        string // API_JWT_ISSUER (required)
	Audience      string // API_JWT_AUDIENCE (required)
}

// JWTVerifier verifies bearer JWTs against the keys it has loaded: it
// never fetches while verifying (it runs in the transport's tap, which
// holds the connection's reader).
type JWTVerifier struct {
	cfg    JWTConfig
	parser *jwt.Parser
	// key is the public key of API_JWT_PUBLIC_KEY_FILE.
	key any
	// jwks is the JWKS of API_JWT_JWKS_URL (refreshed in the background).
	jwks keyfunc.Keyfunc
	ctx  context.Context
	// refreshing: a refresh for an unknown kid is under way.
	refreshing atomic.Bool
	// refreshes counts the refreshes unknown kids started.
	refreshes atomic.Int64
}

// ErrUnknownKID is the error of a JWT whose kid is not among the loaded
// keys.
var ErrUnknownKID = errors.New("its key id (kid) is not among the loaded keys")

// NewJWTVerifier loads the keys (a JWKS is fetched now and refreshed in
// the background until ctx ends).
func NewJWTVerifier(ctx context.Context, cfg JWTConfig) (*JWTVerifier, error) {
	if cfg.Issuer == "" || cfg.Audience == "" {
		return nil, errors.New("API_JWT_ISSUER and API_JWT_AUDIENCE are required with JWTs")
	}
	v := &JWTVerifier{cfg: cfg, ctx: ctx, parser: jwt.NewParser(
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
		v.jwks = k
	case cfg.PublicKeyFile != "":
		key, err := loadPublicKey(cfg.PublicKeyFile)
		if err != nil {
			return nil, err
		}
		v.key = key
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

// loadedKey finds a token's key among the loaded ones and never fetches:
// keyfunc's own Keyfunc refreshes the JWKS for an unknown kid and waits
// for it (up to a minute), which the tap must not. An unknown kid is
// refused; it starts one background refresh (keyfunc rate-limits those to
// one per 5 minutes), so a key the issuer has just rotated in works on a
// later call.
func (v *JWTVerifier) loadedKey(t *jwt.Token) (any, error) {
	if v.jwks == nil {
		return v.key, nil
	}
	kid, hasKID := t.Header["kid"].(string)
	if _, ok := t.Header["kid"]; ok && !hasKID {
		return nil, errors.New("its kid is not a string")
	}
	all, err := v.jwks.Storage().KeyReadAll(v.ctx) // memory only
	if err != nil {
		return nil, err
	}
	var keys jwt.VerificationKeySet
	for _, j := range all {
		m := j.Marshal()
		if hasKID && m.KID != kid {
			continue
		}
		if a := m.ALG.String(); a != "" && a != t.Method.Alg() {
			continue
		}
		k := j.Key()
		if pk, ok := k.(interface{ Public() crypto.PublicKey }); ok {
			k = pk.Public()
		}
		keys.Keys = append(keys.Keys, k)
	}
	if len(keys.Keys) == 0 {
		v.refreshFor(kid)
		if hasKID {
			return nil, ErrUnknownKID
		}
		return nil, errors.New("no key is loaded")
	}
	if len(keys.Keys) == 1 {
		return keys.Keys[0], nil
	}
	return keys, nil
}

// refreshFor starts a background refresh of the JWKS for an unknown kid,
// unless one is under way.
func (v *JWTVerifier) refreshFor(kid string) {
	if !v.refreshing.CompareAndSwap(false, true) {
		return
	}
	v.refreshes.Add(1)
	go func() {
		defer v.refreshing.Store(false)
		ctx, cancel := context.WithTimeout(v.ctx, time.Minute)
		defer cancel()
		_, _ = v.jwks.Storage().KeyRead(ctx, kid) // refreshes (rate-limited) when kid is unknown
	}()
}

// Refreshes is how many background refreshes unknown kids started.
func (v *JWTVerifier) Refreshes() int64 { return v.refreshes.Load() }

// Verify checks a token's signature (with the loaded keys only), issuer,
// audience and expiry and returns its principal. The token must name its
// tenant: a JWT without a "tenant" claim is refused, never taken for the
// default tenant (which has no topic prefix); "default" names it.
func (v *JWTVerifier) Verify(_ context.Context, token string) (Principal, error) {
	var c claims
	if _, err := v.parser.ParseWithClaims(token, &c, v.loadedKey); err != nil {
		return Principal{}, fmt.Errorf("the bearer JWT is not valid: %w", err)
	}
	role, err := ParseRole(c.Role)
	if err != nil {
		return Principal{}, fmt.Errorf("the bearer JWT's \"role\" claim: %w", err)
	}
	if c.Subject == "" {
		return Principal{}, errors.New("the bearer JWT has no \"sub\" claim")
	}
	if c.Tenant == "" {
		return Principal{}, fmt.Errorf("the bearer JWT of %q has no \"tenant\" claim: it must name the tenant (%q for the default tenant)", c.Subject, DefaultTenant)
	}
	if err := tenant.Validate(c.Tenant); err != nil {
		return Principal{}, fmt.Errorf("the bearer JWT's \"tenant\" claim: %w", err)
	}
	return Principal{Subject: c.Subject, Role: role, Tenant: c.Tenant, Via: "jwt"}, nil
}
