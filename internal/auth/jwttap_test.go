package auth_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/virtufin/workmanager/internal/auth"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

const (
	testIssuer   = "https://idp.example"
	testAudience = "workmanager"
)

// goodClaims are a reader's claims for tenant acme.
func goodClaims() jwt.MapClaims {
	return jwt.MapClaims{"iss": testIssuer, "aud": testAudience, "sub": "ci", "role": "reader", "tenant": "acme",
		"exp": time.Now().Add(time.Hour).Unix()}
}

func signJWT(t *testing.T, c jwt.MapClaims, kid string, key ed25519.PrivateKey) string {
	t.Helper()
	tok := jwt.NewWithClaims(jwt.SigningMethodEdDSA, c)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// publicKeyFile writes pub as a PEM file.
func publicKeyFile(t *testing.T, pub ed25519.PublicKey) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "jwt.pub")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// countingListener counts the bytes the server reads from its connections.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{Conn: c, n: l.n}, nil
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// countingHandler counts the calls that reached the handler.
type countingHandler struct {
	echoPrincipal
	n *atomic.Int32
}

func (h countingHandler) GetWorker(ctx context.Context, r *pb.GetWorkerRequest) (*pb.Worker, error) {
	h.n.Add(1)
	return h.echoPrincipal.GetWorker(ctx, r)
}

// TestForgedJWTRefusedBeforeTheMessageIsRead: issue 42 item 7 (a). With
// JWT authentication, a bearer shaped like a JWT whose signature does not
// verify (another key, garbage, alg none) is refused when the stream opens:
// the server reads none of its 3 MiB message (no payload, no handler, and
// the connection carries far less than the message), while a signed JWT is
// read and served.
func TestForgedJWTRefusedBeforeTheMessageIsRead(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	opts, _, err := auth.ServerOptions(context.Background(), auth.Settings{JWT: auth.JWTConfig{
		PublicKeyFile: publicKeyFile(t, pub), Issuer: testIssuer, Audience: testAudience}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	read := &payloads{}
	var handled atomic.Int32
	srv := grpc.NewServer(append(opts, grpc.StatsHandler(read), grpc.MaxRecvMsgSize(8<<20))...)
	pb.RegisterWorkManagerServiceServer(srv, countingHandler{n: &handled})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var bytesIn atomic.Int64
	go srv.Serve(countingListener{Listener: ln, n: &bytesIn})
	defer srv.Stop()
	call := func(token string) (*pb.Worker, error) {
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithPerRPCCredentials(bearer(token)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return pb.NewWorkManagerServiceClient(conn).GetWorker(ctx, &pb.GetWorkerRequest{WorkerId: strings.Repeat("x", 3<<20)})
	}
	const msg = 3 << 20
	for name, token := range map[string]string{
		"another key": signJWT(t, goodClaims(), "", other),
		"x.y.z":       "x.y.z",
		"alg none":    "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.",
	} {
		before := bytesIn.Load()
		if _, err := call(token); status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "JWT") {
			t.Errorf("%s: %v, want UNAUTHENTICATED about the JWT", name, err)
		}
		if n := bytesIn.Load() - before; n > msg/4 {
			t.Errorf("%s: the server read %d bytes of a refused %d-byte call", name, n, msg)
		}
	}
	if n, h := read.n.Load(), handled.Load(); n != 0 || h != 0 {
		t.Fatalf("refused calls: the server read %d messages, its handler ran %d times", n, h)
	}
	w, err := call(signJWT(t, goodClaims(), "", priv))
	if err != nil || w.WorkerId != "jwt:ci/reader/acme" {
		t.Fatalf("a signed JWT: %v %v", w, err)
	}
	if n, h := read.n.Load(), handled.Load(); n != 1 || h != 1 {
		t.Fatalf("the server read %d messages and ran its handler %d times, want 1", n, h)
	}
}

// jwks is a JWK Set of Ed25519 public keys by kid.
func jwks(keys map[string]ed25519.PublicKey) []byte {
	var parts []string
	for kid, k := range keys {
		parts = append(parts, fmt.Sprintf(`{"kty":"OKP","crv":"Ed25519","alg":"EdDSA","use":"sig","kid":%q,"x":%q}`,
			kid, base64.RawURLEncoding.EncodeToString(k)))
	}
	return []byte(`{"keys":[` + strings.Join(parts, ",") + `]}`)
}

// TestUnknownKIDRefusedInTheTapWithoutFetching: issue 42 item 7 (b). With a
// JWKS, a token whose kid is not loaded is refused by the tap at once: the
// tap never waits for the JWKS server (here it hangs on every request after
// the first). Refusals start at most one background refresh, and once it
// brings the new key, the token is accepted.
func TestUnknownKIDRefusedInTheTapWithoutFetching(t *testing.T) {
	pub1, priv1, _ := ed25519.GenerateKey(rand.Reader)
	pub2, priv2, _ := ed25519.GenerateKey(rand.Reader)
	release := make(chan struct{})
	var requests atomic.Int32
	js := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keys := map[string]ed25519.PublicKey{"k1": pub1}
		if requests.Add(1) > 1 {
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
			keys["k2"] = pub2
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(jwks(keys))
	}))
	t.Cleanup(js.Close)
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	v, err := auth.NewJWTVerifier(ctx, auth.JWTConfig{JWKSURL: js.URL, Issuer: testIssuer, Audience: testAudience})
	if err != nil {
		t.Fatal(err)
	}
	a, err := auth.New(auth.Config{JWT: v})
	if err != nil {
		t.Fatal(err)
	}
	tapCall := func(token string) (context.Context, error) {
		return a.TapHandle()(context.Background(), &tap.Info{FullMethodName: get,
			Header: metadata.Pairs("authorization", "Bearer "+token)})
	}
	if _, err := tapCall(signJWT(t, goodClaims(), "k1", priv1)); err != nil {
		t.Fatalf("a token of the loaded key: %v", err)
	}
	k2 := signJWT(t, goodClaims(), "k2", priv2)
	for i := range 20 {
		kid := "k2"
		if i > 0 {
			kid = fmt.Sprintf("unknown-%d", i)
		}
		start := time.Now()
		_, err := tapCall(signJWT(t, goodClaims(), kid, priv2))
		if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "kid") {
			t.Fatalf("kid %s: %v, want UNAUTHENTICATED naming the kid", kid, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("kid %s: the tap took %v (waited for the JWKS server)", kid, d)
		}
	}
	// The interceptor does not wait either.
	start := time.Now()
	if _, err := call(a, incoming("Bearer "+k2), get); status.Code(err) != codes.Unauthenticated || time.Since(start) > time.Second {
		t.Fatalf("the interceptor: %v after %v", err, time.Since(start))
	}
	if n := v.Refreshes(); n != 1 {
		t.Fatalf("%d background refreshes started, want 1 (one at a time)", n)
	}
	// The issuer's new key arrives: the token is accepted.
	unblock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := tapCall(k2)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the refresh: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestJWTMustNameItsTenant: issue 42 item 7 (d). A signed JWT without a
// "tenant" claim (or with an empty one) is refused, at the tap and at the
// interceptor, never taken for the default tenant; "tenant": "default"
// names it.
func TestJWTMustNameItsTenant(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	v, err := auth.NewJWTVerifier(context.Background(), auth.JWTConfig{PublicKeyFile: publicKeyFile(t, pub), Issuer: testIssuer, Audience: testAudience})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := auth.New(auth.Config{JWT: v})
	with := func(tenant any) string {
		c := goodClaims()
		if tenant == nil {
			delete(c, "tenant")
		} else {
			c["tenant"] = tenant
		}
		return signJWT(t, c, "", priv)
	}
	for name, token := range map[string]string{"no tenant claim": with(nil), "an empty tenant": with("")} {
		if _, err := call(a, incoming("Bearer "+token), get); status.Code(err) != codes.Unauthenticated ||
			!strings.Contains(err.Error(), `no "tenant" claim`) || !strings.Contains(err.Error(), `"default" for the default tenant`) {
			t.Errorf("%s, interceptor: %v", name, err)
		}
		_, err := a.TapHandle()(context.Background(), &tap.Info{FullMethodName: get, Header: metadata.Pairs("authorization", "Bearer "+token)})
		if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), `no "tenant" claim`) {
			t.Errorf("%s, tap: %v", name, err)
		}
	}
	p, err := call(a, incoming("Bearer "+with("default")), get)
	if err != nil || p != (auth.Principal{Subject: "ci", Role: auth.RoleReader, Tenant: auth.DefaultTenant, Via: "jwt"}) {
		t.Fatalf(`"tenant": "default": %+v %v`, p, err)
	}
}
