package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The control plane stays thin: it validates, stages code and talks to
// Temporal, and must not link the message path (engines, the dispatcher, the
// node) or native loading.
func TestControlPlaneDoesNotLinkTheMessagePath(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, banned := range []string{"github.com/virtufin/workmanager/engines/", "github.com/virtufin/workmanager/internal/dispatch",
			"github.com/virtufin/workmanager/internal/node", "github.com/ebitengine/purego", "github.com/google/flatbuffers"} {
			if strings.HasPrefix(pkg, banned) {
				t.Errorf("cmd/api links %s", pkg)
			}
		}
	}
}
