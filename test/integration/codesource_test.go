package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// URL code sources on the real stack (the harness allows loopback, for
// its httptest servers, and nothing else the SSRF rules refuse): private,
// link-local and oddly spelt addresses are refused at CreateWorker with
// PERMISSION_DENIED; a redirect from the allowed server to the metadata
// address is refused by the node that fetches, with PERMISSION_DENIED too;
// nothing is persisted for either; a pinned URL from the allowed server
// works end to end.
func TestCodeURLSources(t *testing.T) {
	inTurn(t) // functional, no timing assertions: runs next to the other parallel tests after the serial ones
	e := newEnv(t, "")
	out := topicName(t, "out")
	code := echoWorker(out, "from-url")
	sum := sha256.Sum256(code)
	sha := hex.EncodeToString(sum[:])
	var fetches int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fetches++
		if r.URL.Path == "/redirect" {
			http.Redirect(w, r, "http://169.254.169.254/latest/meta-data/", http.StatusFound)
			return
		}
		_, _ = w.Write(code)
	}))
	defer srv.Close()
	ctx := ctxT(t)
	create := func(name, url string) error {
		_, err := e.client.CreateWorker(ctx, &pb.CreateWorkerRequest{MimeType: "text/x-python", Topic: topicName(t, "in"), Name: name,
			Code: &pb.CodeSource{Source: &pb.CodeSource_Url{Url: &pb.UrlSource{Url: url, Sha256: sha}}}})
		return err
	}
	for _, c := range []struct{ url, rule string }{
		{"http://10.0.0.1/w.py", `address_class: address "10.0.0.1" is private`},
		{"http://169.254.169.254/latest/meta-data/", "metadata"},
		{"http://metadata.google.internal/computeMetadata/v1/", "metadata_host"}, // by name, before any DNS (issue 23)
		{"http://[::ffff:10.0.0.1]/w.py", "ipv4_mapped:private"},
		{"http://0x7f000001/w.py", "non_canonical_address"},
		{"http://user:pw@example.com/w.py", "userinfo"},
		{"http://example.com/w.py?token=abc", "credentials_in_url"},
		{srv.URL + "/redirect", "redirect"},
	} {
		err := create("refused", c.url)
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), c.rule) || strings.Contains(err.Error(), "pw@") ||
			strings.Contains(err.Error(), "scheduledEventID") {
			t.Fatalf("%s: got %v, want PERMISSION_DENIED naming %q", c.url, err, c.rule)
		}
		if _, err := e.client.GetWorker(ctx, &pb.GetWorkerRequest{WorkerId: "refused"}); status.Code(err) != codes.NotFound {
			t.Fatalf("%s: the refused worker exists: %v", c.url, err)
		}
	}
	if fetches != 1 {
		t.Fatalf("the allowed server was asked %d times, want once (the redirect)", fetches)
	}

	// The pinned URL works end to end, and the history names it.
	if err := create("from-url", srv.URL+"/w.py"); err != nil {
		t.Fatalf("pinned URL: %v", err)
	}
	if _, err := e.client.StartWorker(ctx, &pb.StartWorkerRequest{WorkerId: "from-url"}); err != nil {
		t.Fatal(err)
	}
	outs := e.subscribe(out)
	e.publish(mustWorker(t, e, "from-url").GetTopic(), "u-1", map[string]any{"n": 1}, "")
	if got := decodeOut(t, expectEvent(t, outs, 30*time.Second).Data()); got.Version != "from-url" {
		t.Fatalf("output %+v", got)
	}
	h, err := e.client.GetWorkerHistory(ctx, &pb.GetWorkerHistoryRequest{WorkerId: "from-url"})
	if err != nil || len(h.GetEntries()) != 1 || h.GetEntries()[0].GetUrl() != srv.URL+"/w.py" || h.GetEntries()[0].GetSha256() != sha {
		t.Fatalf("history %v %v", h, err)
	}
}

func mustWorker(t *testing.T, e *env, ref string) *pb.Worker {
	t.Helper()
	w, err := e.client.GetWorker(ctxT(t), &pb.GetWorkerRequest{WorkerId: ref})
	if err != nil {
		t.Fatal(err)
	}
	return w
}
