package auth_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/auth"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Every RPC of the service has a least role: a new RPC without an entry
// fails here (and is refused to everybody until it gets one).
func TestEveryRPCHasARole(t *testing.T) {
	sd := pb.WorkManagerService_ServiceDesc
	n := 0
	for _, m := range sd.Methods {
		full := "/" + sd.ServiceName + "/" + m.MethodName
		if _, ok := auth.MethodRoles[full]; !ok {
			t.Errorf("%s has no entry in auth.MethodRoles", full)
		}
		n++
	}
	for _, s := range sd.Streams {
		full := "/" + sd.ServiceName + "/" + s.StreamName
		if _, ok := auth.MethodRoles[full]; !ok {
			t.Errorf("%s has no entry in auth.MethodRoles", full)
		}
		n++
	}
	if n < 11 {
		t.Fatalf("only %d RPCs seen", n)
	}
}

func writeTokens(t *testing.T, lines ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func incoming(header string) context.Context {
	md := metadata.MD{}
	if header != "" {
		md.Set("authorization", header)
	}
	return metadata.NewIncomingContext(context.Background(), md)
}

// call runs method through the unary interceptor and returns the principal
// the handler saw.
func call(a *auth.Authenticator, ctx context.Context, method string) (auth.Principal, error) {
	var got auth.Principal
	_, err := a.UnaryInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: method}, func(ctx context.Context, _ any) (any, error) {
		got, _ = auth.FromContext(ctx)
		return nil, nil
	})
	return got, err
}

const (
	create = "/workmanager.v1.WorkManagerService/CreateWorker"
	get    = "/workmanager.v1.WorkManagerService/GetWorker"
	recov  = "/workmanager.v1.WorkManagerService/RecoverWorkers"
	health = "/grpc.health.v1.Health/Check"
)

func TestTokensAndRoles(t *testing.T) {
	path := writeTokens(t, "# dev tokens", "",
		"sha256:"+auth.HashToken("reader-token")+" reader acme alice",
		"sha256:"+auth.HashToken("operator-token")+" operator acme bob",
		"sha256:"+auth.HashToken("admin-token")+" admin default root")
	ts, err := auth.LoadTokens(path)
	if err != nil {
		t.Fatal(err)
	}
	a, err := auth.New(auth.Config{Tokens: ts, PublicMethods: auth.HealthAndReflection})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		header, method string
		code           codes.Code
		msg            string
	}{
		{"", create, codes.Unauthenticated, "no credentials"},
		{"Basic abc", create, codes.Unauthenticated, `must be "Bearer <token>"`},
		{"Bearer wrong", get, codes.Unauthenticated, "not valid"},
		{"Bearer reader-token", get, codes.OK, ""},
		{"Bearer reader-token", create, codes.PermissionDenied, "needs the operator role; token \"alice\" has reader"},
		{"bearer operator-token", create, codes.OK, ""},
		{"Bearer operator-token", recov, codes.PermissionDenied, "needs the admin role"},
		{"Bearer admin-token", recov, codes.OK, ""},
		{"", health, codes.OK, ""},
		{"Bearer admin-token", "/workmanager.v1.WorkManagerService/NoSuchRPC", codes.PermissionDenied, "no role may call it"},
	} {
		p, err := call(a, incoming(c.header), c.method)
		if status.Code(err) != c.code || (c.msg != "" && !strings.Contains(err.Error(), c.msg)) {
			t.Errorf("%q %s: %v, want %v %q", c.header, c.method, err, c.code, c.msg)
		}
		if c.code == codes.OK && c.header != "" && (p.Tenant == "" || p.Subject == "") {
			t.Errorf("%q %s: principal %+v", c.header, c.method, p)
		}
	}
	if p, _ := call(a, incoming("Bearer operator-token"), create); p != (auth.Principal{Subject: "bob", Role: auth.RoleOperator, Tenant: "acme", Via: "token"}) {
		t.Fatalf("principal %+v", p)
	}
}

func TestLoadTokensRefusesBadFiles(t *testing.T) {
	for _, lines := range [][]string{
		{"# nothing"},
		{"plaintoken reader default x"},
		{"sha256:abc reader default x"},
		{"sha256:" + auth.HashToken("x") + " superuser default x"},
		{"sha256:" + auth.HashToken("x") + " reader default"},
	} {
		if _, err := auth.LoadTokens(writeTokens(t, lines...)); err == nil || !strings.Contains(err.Error(), "API_TOKENS_FILE") {
			t.Errorf("%q: %v", lines, err)
		}
	}
	if _, err := auth.New(auth.Config{}); err == nil || !strings.Contains(err.Error(), "no authentication method") {
		t.Errorf("no method: %v", err)
	}
}

func TestOffIsAdminOfTheDefaultTenant(t *testing.T) {
	a, err := auth.New(auth.Config{Off: true})
	if err != nil {
		t.Fatal(err)
	}
	p, err := call(a, incoming(""), recov)
	if err != nil || p.Role != auth.RoleAdmin || p.Tenant != auth.DefaultTenant {
		t.Fatalf("%+v %v", p, err)
	}
}

func TestJWT(t *testing.T) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(t.TempDir(), "jwt.pub")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	v, err := auth.NewJWTVerifier(context.Background(), auth.JWTConfig{PublicKeyFile: keyFile, Issuer: "https://idp.example", Audience: "workmanager"})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := auth.New(auth.Config{JWT: v})
	sign := func(c jwt.MapClaims, key ed25519.PrivateKey) string {
		s, err := jwt.NewWithClaims(jwt.SigningMethodEdDSA, c).SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	good := jwt.MapClaims{"iss": "https://idp.example", "aud": "workmanager", "sub": "ci", "role": "operator", "tenant": "acme",
		"exp": time.Now().Add(time.Hour).Unix()}
	with := func(k string, v any) jwt.MapClaims {
		c := jwt.MapClaims{}
		for kk, vv := range good {
			c[kk] = vv
		}
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
		return c
	}
	p, err := call(a, incoming("Bearer "+sign(good, priv)), create)
	if err != nil || p != (auth.Principal{Subject: "ci", Role: auth.RoleOperator, Tenant: "acme", Via: "jwt"}) {
		t.Fatalf("good JWT: %+v %v", p, err)
	}
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	for name, c := range map[string]struct {
		token string
		code  codes.Code
		msg   string
	}{
		"other key":    {sign(good, other), codes.Unauthenticated, "signature"},
		"expired":      {sign(with("exp", time.Now().Add(-time.Hour).Unix()), priv), codes.Unauthenticated, "expired"},
		"no exp":       {sign(with("exp", nil), priv), codes.Unauthenticated, "exp"},
		"wrong issuer": {sign(with("iss", "https://evil"), priv), codes.Unauthenticated, "iss"},
		"wrong aud":    {sign(with("aud", "other"), priv), codes.Unauthenticated, "aud"},
		"bad role":     {sign(with("role", "god"), priv), codes.Unauthenticated, `"role" claim`},
		"no sub":       {sign(with("sub", nil), priv), codes.Unauthenticated, `"sub"`},
		"reader":       {sign(with("role", "reader"), priv), codes.PermissionDenied, "needs the operator role"},
		"alg none":     {"eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.", codes.Unauthenticated, "not valid"},
	} {
		if _, err := call(a, incoming("Bearer "+c.token), create); status.Code(err) != c.code || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want %v containing %q", name, err, c.code, c.msg)
		}
	}
}
