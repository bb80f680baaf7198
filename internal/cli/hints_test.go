package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Messages that say what to do next (issue 44 item 8).

// A typo in the config file lists the keys the file may have.
func TestConfigFileTypoListsTheValidKeys(t *testing.T) {
	dir := t.TempDir()
	path := write(t, filepath.Join(dir, "c.yaml"), "adress: x:1\n")
	_, err := config(t, nil, dir, "--config", path)
	if err == nil || !strings.Contains(err.Error(), `"adress"`) ||
		!strings.Contains(err.Error(), "valid keys: addr, token, token_file, tls, ca, cert, key, dapr") {
		t.Fatalf("err %v, want it to name the unknown key and list the valid ones", err)
	}
}

// A code URL the server's policy refuses is a rejected request (exit 5),
// not an authentication failure (exit 4); a role too low stays 4.
func TestRefusedURLIsARejectedRequest(t *testing.T) {
	f := startFake(t, nil)
	env := map[string]string{"WMCTL_ADDR": f.addr, "WMCTL_TOKEN": goodToken}
	f.mu.Lock()
	f.fail = status.Error(codes.PermissionDenied, `code.url refused by rule address_class: address "10.0.0.1" is private`)
	f.mu.Unlock()
	r := run(t, env, "", "create", "--url", "https://10.0.0.1/w.py", "--sha256", strings.Repeat("0", 64), "--topic", "t")
	if r.code != ExitInvalid || !strings.Contains(r.err, "code.url refused by rule address_class") {
		t.Errorf("refused URL: exit %d, stderr %q; want %d", r.code, r.err, ExitInvalid)
	}
	f.mu.Lock()
	f.fail = status.Error(codes.PermissionDenied, `CreateWorker needs the operator role; token "ci" has viewer`)
	f.mu.Unlock()
	if r := run(t, env, "", "create", "--url", "https://example.com/w.py", "--sha256", strings.Repeat("0", 64), "--topic", "t"); r.code != ExitAuth {
		t.Errorf("role too low: exit %d, stderr %q; want %d", r.code, r.err, ExitAuth)
	}
}

// Without any credentials (outside the repository root, where
// .run/dev-token is not found), UNAUTHENTICATED says how to pass the dev
// token; with a token that was refused it does not.
func TestNoCredentialsSaysHowToPassTheDevToken(t *testing.T) {
	f := startFake(t, nil)
	f.add(&pb.Worker{WorkerId: "w-1"})
	elsewhere := t.TempDir()
	r := run(t, map[string]string{"WMCTL_ADDR": f.addr}, elsewhere, "get", "w-1")
	for _, want := range []string{"missing or unknown credentials", "no credentials were sent", "--token-file", "WMCTL_TOKEN_FILE", ".run/dev-token"} {
		if r.code != ExitAuth || !strings.Contains(r.err, want) {
			t.Errorf("no token: exit %d, stderr %q; want %d and %q", r.code, r.err, ExitAuth, want)
		}
	}
	r = run(t, map[string]string{"WMCTL_ADDR": f.addr, "WMCTL_TOKEN": "wrong"}, elsewhere, "get", "w-1")
	if r.code != ExitAuth || strings.Contains(r.err, "no credentials were sent") || !strings.Contains(r.err, "WMCTL_TOKEN") {
		t.Errorf("refused token: exit %d, stderr %q; want %d naming where the token came from", r.code, r.err, ExitAuth)
	}
}

// reload with code of another kind than the worker's MIME type is refused
// before anything is sent (the engine would only answer a SyntaxError);
// --force sends it anyway.
func TestReloadRefusesCodeOfAnotherKind(t *testing.T) {
	f := startFake(t, nil)
	f.add(&pb.Worker{WorkerId: "w-1", Name: "pricer", Topic: "orders", MimeType: MIMECSharp})
	dir := t.TempDir()
	py := write(t, filepath.Join(dir, "worker.py"), "def process(e): pass\n")
	r := run(t, map[string]string{"WMCTL_ADDR": f.addr, "WMCTL_TOKEN": goodToken}, "", "reload", "pricer", py)
	if r.code != ExitUsage || !strings.Contains(r.err, "text/x-csharp") || !strings.Contains(r.err, "text/x-python") ||
		!strings.Contains(r.err, "wmctl create") {
		t.Errorf("reload .py into a C# worker: exit %d, stderr %q", r.code, r.err)
	}
	f.mu.Lock()
	loads := len(f.loads)
	f.mu.Unlock()
	if loads != 0 {
		t.Fatalf("LoadCode was sent %d times", loads)
	}
	cs := write(t, filepath.Join(dir, "Pricer.cs"), "public class P {}\n")
	f.runOK(t, "reload", "pricer", cs)
	f.runOK(t, "reload", "pricer", py, "--force")
	f.mu.Lock()
	loads = len(f.loads)
	f.mu.Unlock()
	if loads != 2 {
		t.Fatalf("LoadCode sent %d times, want 2 (matching kind, --force)", loads)
	}
}

// The engine compiles a C# worker under the name Worker.cs; wmctl shows
// the compiler's messages with the file it sent.
func TestCSharpErrorsNameTheUsersFile(t *testing.T) {
	f := startFake(t, nil)
	dir := t.TempDir()
	cs := write(t, filepath.Join(dir, "Pricer.cs"), "public class P {\n")
	f.mu.Lock()
	f.fail = status.Error(codes.InvalidArgument, "invalid worker code: compile error: Worker.cs:1:17: error CS1525: Unexpected symbol `end-of-file'")
	f.mu.Unlock()
	r := run(t, map[string]string{"WMCTL_ADDR": f.addr, "WMCTL_TOKEN": goodToken}, "", "create", cs, "--topic", "t")
	if r.code != ExitInvalid || !strings.Contains(r.err, "Pricer.cs:1:17: error CS1525") || strings.Contains(r.err, "Worker.cs") {
		t.Errorf("compile error: exit %d, stderr %q; want Pricer.cs:1:17", r.code, r.err)
	}
}

// A bare shared library is refused with how to package it.
func TestBareSharedLibrarySaysHowToPackageIt(t *testing.T) {
	f := startFake(t, nil)
	dir := t.TempDir()
	so := filepath.Join(dir, "libecho.so")
	if err := os.WriteFile(so, []byte("\x7fELF\x02\x01\x01"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := run(t, map[string]string{"WMCTL_ADDR": f.addr, "WMCTL_TOKEN": goodToken}, "", "create", so, "--topic", "t")
	for _, want := range []string{"libecho.so is a bare shared library", "zip", "manifest.json", "runtimes/linux-x64/native/libecho.so",
		"make package", "wmctl new"} {
		if r.code != ExitUsage || !strings.Contains(r.err, want) {
			t.Errorf("bare .so: exit %d, stderr %q; want %d and %q", r.code, r.err, ExitUsage, want)
		}
	}
}
