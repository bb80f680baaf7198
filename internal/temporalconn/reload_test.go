package temporalconn

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A rotated API key file is read again (once its stamp changed and the
// check interval passed); a file that stops loading keeps the last good
// key.
func TestReloadingPicksUpARotatedFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(p, []byte("first"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := &reloading[string]{files: []string{p}, load: func() (string, error) { return readAPIKey(p) }}
	if v, err := r.get(); err != nil || v != "first" {
		t.Fatalf("%q %v", v, err)
	}
	if err := os.WriteFile(p, []byte("second-key"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.checked = time.Time{} // the check interval passed
	if v, err := r.get(); err != nil || v != "second-key" {
		t.Fatalf("after rotation: %q %v", v, err)
	}
	if err := os.WriteFile(p, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.checked = time.Time{}
	if v, err := r.get(); err != nil || v != "second-key" {
		t.Fatalf("after a bad rotation: %q %v, want the last good key", v, err)
	}
}
