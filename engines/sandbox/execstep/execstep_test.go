package execstep

import "testing"

// A --tmpfs without its directory, options and a program after them is a
// usage error, found before anything is mounted or executed.
func TestTmpfsArgumentsAreChecked(t *testing.T) {
	for _, args := range [][]string{
		{"3", "-", "--tmpfs"},
		{"3", "-", "--tmpfs", "/d"},
		{"3", "-", "--tmpfs", "/d", "size=1"},
		{"3", "-", "--tmpfs", "/d", "size=1", "--tmpfs", "/e"},
	} {
		if got := Main(args); got != ExitUsage {
			t.Errorf("Main(%q) = %d, want %d (usage)", args, got, ExitUsage)
		}
	}
}
