package gateway_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dapr "github.com/dapr/go-sdk/client"

	"github.com/virtufin/workmanager/internal/devstack"
	"github.com/virtufin/workmanager/internal/gateway"
)

// TestCallThroughRealDapr invokes an HTTP backend through daprd's service
// invocation (an HTTPEndpoint resource), as native workers' gateway_call does.
func TestCallThroughRealDapr(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"method":"` + r.Method + `","path":"` + r.URL.Path + `","got":` + string(body) + `}`))
	}))
	defer backend.Close()
	_, conn := devstack.StartT(t, devstack.Options{
		ExtraResources: map[string]string{"pricing.yaml": devstack.HTTPEndpoint("pricing", backend.URL)}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g := gateway.NewDapr(dapr.NewClientWithConnection(conn), 10*time.Second)
	resp, err := g.Call(ctx, "pricing", "quote", []byte(`{"sku":"a"}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"method":"POST","path":"/quote","got":{"sku":"a"}}`; string(resp) != want {
		t.Fatalf("response %s, want %s", resp, want)
	}
	if _, err := g.Call(ctx, "no-such-service", "x", nil); err == nil || !strings.Contains(err.Error(), "no-such-service") {
		t.Fatalf("unknown service: %v", err)
	}
	if _, err := g.Call(ctx, "", "x", nil); err == nil {
		t.Fatal("empty service accepted")
	}
}
