package builtin

import (
	"slices"
	"testing"

	"github.com/virtufin/workmanager/engines"
)

// The control plane validates MIME types against engines.BuiltinMIMETypes
// without linking the engines: it must stay what the registry serves.
func TestBuiltinMIMETypesMatchTheRegistry(t *testing.T) {
	reg, err := Registry(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := reg.MIMETypes(), engines.BuiltinMIMETypes(); !slices.Equal(got, want) {
		t.Fatalf("registry serves %v, engines.BuiltinMIMETypes says %v", got, want)
	}
}
