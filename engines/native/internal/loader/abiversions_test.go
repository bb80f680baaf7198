package loader

import (
	"strings"
	"testing"
)

func TestABIPolicy(t *testing.T) {
	if err := CheckABI(CurrentABI); err != nil {
		t.Fatal(err)
	}
	saved := abis
	t.Cleanup(func() { abis = saved })
	// Pretend v2 shipped and v1 was dropped: v1 is "no longer supported".
	abis = []ABI{{Version: 3}, {Version: 2, Deprecated: true}}
	for v, want := range map[int]string{
		1: "manifest.json: abi_version 1 is no longer supported (supported: 2, 3); rebuild the worker",
		9: "manifest.json: abi_version 9 is not supported (supported: 2, 3)",
	} {
		if err := CheckABI(v); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckABI(%d) = %v, want it to contain %q", v, err, want)
		}
	}
}
