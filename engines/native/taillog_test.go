package native

import (
	"strings"
	"testing"
)

// Issue 42, item 5: the isolated host's tail log keeps its 200 lines at
// most tailWidth bytes wide (it kept up to 64 KiB a line, 12.5 MiB a
// host), and still shows a crash report.
func TestTailLogBoundsItsLines(t *testing.T) {
	var tl tailLog
	wide := strings.Repeat("x", 64<<10)
	for range 2 * tailLines {
		tl.add(wide)
	}
	kept := 0
	for _, l := range tl.lines {
		kept += len(l)
	}
	if kept > tailLines*(tailWidth+3) {
		t.Fatalf("the tail keeps %d bytes", kept)
	}
	tl.add("fatal error: unexpected signal during runtime execution")
	tl.add("[signal SIGSEGV: segmentation violation code=0x1 addr=0x0 pc=0x7f]")
	if s := tl.String(); !strings.Contains(s, "fatal error: unexpected signal") || len(s) > 8*(tailWidth+3) {
		t.Fatalf("summary of %d bytes: %.200q", len(s), s)
	}
}
