// Package auth owns who may call the control API. It authenticates a call
// into a Principal (subject, role, tenant) from a client certificate
// verified by TLS against a configured CA, a bearer token listed (as its
// SHA-256) in a tokens file, or a bearer JWT verified against a JWKS or a
// public key; and it authorizes the call against one table of RPC → least
// role. Both run in one gRPC interceptor; handlers read the Principal
// with FromContext.
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/credfile"
	"github.com/virtufin/workmanager/internal/tenant"
)

// Role is what a caller may do; a higher role may do what a lower may.
type Role int

const (
	// RoleNone is no role (an unknown role name).
	RoleNone Role = iota
	// RoleReader may read workers, their history and dead letters.
	RoleReader
	// RoleOperator may also create, change, start, stop and delete
	// workers and replay dead letters.
	RoleOperator
	// RoleAdmin may also trigger recovery and act across tenants.
	RoleAdmin
)

func (r Role) String() string {
	switch r {
	case RoleReader:
		return "reader"
	case RoleOperator:
		return "operator"
	case RoleAdmin:
		return "admin"
	}
	return "none"
}

// ParseRole reads a role name.
func ParseRole(s string) (Role, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "reader":
		return RoleReader, nil
	case "operator":
		return RoleOperator, nil
	case "admin":
		return RoleAdmin, nil
	}
	return RoleNone, fmt.Errorf("role %q is not one of reader, operator, admin", s)
}

// DefaultTenant is the tenant of a credential that names none.
const DefaultTenant = tenant.Default

// Principal is an authenticated caller.
type Principal struct {
	Subject string // who: the token's subject, the JWT's sub, the certificate's CN
	Role    Role
	Tenant  string
	// Via is how the caller authenticated: "token", "jwt", "mtls" or "none"
	// (authentication off).
	Via string
}

type principalKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the caller of a call the interceptor let through.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// Config says how callers authenticate. At least one method must be
// configured unless Off is set.
type Config struct {
	// Off turns authentication off (API_AUTH=off): every call is an admin
	// of the default tenant. Loud at start and on /health.
	Off bool
	// Tokens are the accepted static bearer tokens (TokensFile parsed).
	Tokens *TokenSet
	// JWT verifies bearer JWTs (nil: JWTs are not accepted).
	JWT *JWTVerifier
	// ClientCertificates: callers may authenticate with a client
	// certificate (the server's TLS config verifies it against the CA);
	// its subject gives the principal: CN the subject, exactly one OU the
	// role, exactly one O the tenant.
	ClientCertificates bool
	// PublicMethods are full method names callable without credentials
	// (the gRPC health service and reflection when API_PUBLIC_HEALTH).
	PublicMethods []string
	// Log receives refusals (without the credentials).
	Log *slog.Logger
}

// Authenticator authenticates and authorizes calls.
type Authenticator struct {
	cfg    Config
	public map[string]bool
}

// New checks cfg and returns an Authenticator.
func New(cfg Config) (*Authenticator, error) {
	if !cfg.Off && cfg.Tokens == nil && cfg.JWT == nil && !cfg.ClientCertificates {
		return nil, errors.New("auth: no authentication method configured (API_TOKENS_FILE, API_JWT_*, API_CLIENT_CA_FILE), and API_AUTH is not off")
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	a := &Authenticator{cfg: cfg, public: map[string]bool{}}
	for _, m := range cfg.PublicMethods {
		a.public[m] = true
	}
	return a, nil
}

// Methods says which methods are on.
func (a *Authenticator) Methods() []string {
	if a.cfg.Off {
		return []string{"off"}
	}
	var m []string
	if a.cfg.ClientCertificates {
		m = append(m, "mtls")
	}
	if a.cfg.Tokens != nil {
		m = append(m, "token")
	}
	if a.cfg.JWT != nil {
		m = append(m, "jwt")
	}
	return m
}

// Authenticate finds the caller of ctx (an incoming gRPC call).
func (a *Authenticator) Authenticate(ctx context.Context) (Principal, error) {
	if a.cfg.Off {
		return Principal{Subject: "anonymous", Role: RoleAdmin, Tenant: DefaultTenant, Via: "none"}, nil
	}
	if a.cfg.ClientCertificates {
		if cert := verifiedClientCert(ctx); cert != nil {
			return principalFromCert(cert)
		}
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		return Principal{}, errors.New("no credentials: send \"authorization: Bearer <token>\" (or a client certificate)")
	}
	scheme, cred, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "bearer") || strings.TrimSpace(cred) == "" {
		return Principal{}, errors.New("the authorization header must be \"Bearer <token>\"")
	}
	cred = strings.TrimSpace(cred)
	if strings.Count(cred, ".") == 2 && a.cfg.JWT != nil {
		return a.cfg.JWT.Verify(ctx, cred)
	}
	if a.cfg.Tokens != nil {
		if p, ok := a.cfg.Tokens.Lookup(cred); ok {
			return p, nil
		}
	}
	return Principal{}, errors.New("the bearer token is not valid")
}

// verifiedClientCert returns the client's leaf certificate when TLS
// verified its chain.
func verifiedClientCert(ctx context.Context) *x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return nil
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return nil
	}
	return ti.State.VerifiedChains[0][0]
}

func principalFromCert(c *x509.Certificate) (Principal, error) {
	p := Principal{Subject: c.Subject.CommonName, Tenant: DefaultTenant, Via: "mtls"}
	if len(c.Subject.OrganizationalUnit) != 1 {
		return Principal{}, fmt.Errorf("client certificate %q: its subject needs exactly one OU, the role (reader, operator, admin)", p.Subject)
	}
	role, err := ParseRole(c.Subject.OrganizationalUnit[0])
	if err != nil {
		return Principal{}, fmt.Errorf("client certificate %q: %w", p.Subject, err)
	}
	p.Role = role
	// Exactly one O, the tenant: a certificate without one (or with
	// several) would otherwise fall to the default tenant, which has no
	// topic prefix. The default tenant's certificates say O=default.
	if len(c.Subject.Organization) != 1 {
		return Principal{}, fmt.Errorf("client certificate %q: its subject needs exactly one O, the tenant (%q for the default tenant), has %d", p.Subject, DefaultTenant, len(c.Subject.Organization))
	}
	p.Tenant = c.Subject.Organization[0]
	if err := tenant.Validate(p.Tenant); err != nil {
		return Principal{}, fmt.Errorf("client certificate %q: its O, the tenant: %w", p.Subject, err)
	}
	if p.Subject == "" {
		return Principal{}, errors.New("client certificate without a CN (the subject)")
	}
	return p, nil
}

// authorize checks p against the least role of method.
func (a *Authenticator) authorize(p Principal, method string) error {
	need, ok := MethodRoles[method]
	if !ok {
		// A method without an entry is nobody's (the table test keeps
		// every RPC listed).
		return status.Errorf(codes.PermissionDenied, "%s: no role may call it", method)
	}
	if p.Role < need {
		return status.Errorf(codes.PermissionDenied, "%s needs the %s role; %s %q has %s", method, need, p.Via, p.Subject, p.Role)
	}
	return nil
}

func (a *Authenticator) check(ctx context.Context, method string) (context.Context, error) {
	if a.public[method] {
		return ctx, nil
	}
	// The tap authenticated the call from the same headers: only its
	// role is checked again (a server without the tap authenticates here).
	p, ok := ctx.Value(tapPrincipalKey{}).(Principal)
	var err error
	if !ok {
		p, err = a.Authenticate(ctx)
	}
	if err != nil {
		a.cfg.Log.Warn("api call refused: not authenticated", "method", method, "reason", err.Error())
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	if err := a.authorize(p, method); err != nil {
		a.cfg.Log.Warn("api call refused: not authorized", "method", method, "subject", p.Subject, "role", p.Role.String(), "tenant", p.Tenant)
		return nil, err
	}
	return WithPrincipal(ctx, p), nil
}

// UnaryInterceptor authenticates and authorizes unary calls.
func (a *Authenticator) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ctx, err := a.check(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return h(ctx, req)
	}
}

// StreamInterceptor authenticates and authorizes streaming calls (health
// Watch, reflection).
func (a *Authenticator) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		ctx, err := a.check(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		return h(srv, &wrappedStream{ServerStream: ss, ctx: ctx})
	}
}

type wrappedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (w *wrappedStream) Context() context.Context { return w.ctx }

// TokenSet is the accepted static tokens, by the SHA-256 of the token.
// One made by WatchTokens follows its file's changes.
type TokenSet struct {
	byHash  map[string]Principal
	watched *credfile.Watched[*TokenSet]
}

// WatchTokens reads a tokens file (as LoadTokens) and reads it again when
// its content changes, checked at most every interval (0: read once): a
// rotated file's tokens are accepted, and the removed ones refused, from
// the first call one interval later. A changed file that does not load
// keeps the tokens in use (logged to log as an error).
func WatchTokens(path string, interval time.Duration, log *slog.Logger) (*TokenSet, error) {
	w, err := credfile.New("API_TOKENS_FILE", []string{path}, interval, log, func() (*TokenSet, error) { return LoadTokens(path) })
	if err != nil {
		return nil, err
	}
	return &TokenSet{watched: w}, nil
}

// Run checks a watched set's file every interval until ctx ends, so that
// a rotation is logged while no call comes (nothing for a loaded set).
func (t *TokenSet) Run(ctx context.Context) {
	if t.watched != nil {
		t.watched.Run(ctx)
	}
}

// HashToken is the form a token is listed in a tokens file.
func HashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// LoadTokens reads a tokens file: one token per line, "sha256:<hex of the
// token's SHA-256> <role> <tenant> <subject>"; blank lines and lines
// starting with # are skipped. The file holds no token itself.
func LoadTokens(path string) (*TokenSet, error) {
	b, err := credfile.ReadLimited("API_TOKENS_FILE", path)
	if err != nil {
		return nil, err
	}
	ts := &TokenSet{byHash: map[string]Principal{}}
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		hash, ok := strings.CutPrefix(f[0], "sha256:")
		if len(f) != 4 || !ok || len(hash) != 64 {
			return nil, fmt.Errorf("API_TOKENS_FILE %s line %d: want \"sha256:<64 hex digits> <role> <tenant> <subject>\"", path, i+1)
		}
		if _, err := hex.DecodeString(hash); err != nil {
			return nil, fmt.Errorf("API_TOKENS_FILE %s line %d: the hash is not hex", path, i+1)
		}
		role, err := ParseRole(f[1])
		if err != nil {
			return nil, fmt.Errorf("API_TOKENS_FILE %s line %d: %w", path, i+1, err)
		}
		if err := tenant.Validate(f[2]); err != nil {
			return nil, fmt.Errorf("API_TOKENS_FILE %s line %d: the tenant: %w", path, i+1, err)
		}
		ts.byHash[strings.ToLower(hash)] = Principal{Role: role, Tenant: f[2], Subject: f[3], Via: "token"}
	}
	if len(ts.byHash) == 0 {
		return nil, fmt.Errorf("API_TOKENS_FILE %s lists no token", path)
	}
	return ts, nil
}

// Lookup finds the principal of token.
func (t *TokenSet) Lookup(token string) (Principal, bool) {
	if t.watched != nil {
		t = t.watched.Get()
	}
	p, ok := t.byHash[HashToken(token)]
	return p, ok
}
