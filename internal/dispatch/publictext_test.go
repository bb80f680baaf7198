package dispatch

import (
	"runtime"
	"strings"
	"testing"
)

func TestPublicText(t *testing.T) {
	d := &Dispatcher{cfg: Config{Secrets: []string{"s3cr3t-token", "abc"}}}
	for in, want := range map[string]string{
		"native engine: /tmp/virtufin-native-123/libfoo.so: cannot open":             "native engine: .../libfoo.so: cannot open",
		`File "/root/.pyenv/versions/3.11.7/lib/python3.11/json/decoder.py", line 3`: `File ".../decoder.py", line 3`,
		"gateway: GET http://billing/charge failed":                                  "gateway: GET http://billing/charge failed",
		"token s3cr3t-token was refused (abc)":                                       "token [redacted] was refused (abc)",
		"a / b and /single stay":                                                     "a / b and /single stay",
	} {
		if got := d.publicText(in); got != want {
			t.Errorf("%q:\n got %q\nwant %q", in, got, want)
		}
	}
	if got := d.publicText(strings.Repeat("x", 5000)); len(got) != maxErrorText || !strings.HasSuffix(got, "...") {
		t.Errorf("long text: %d bytes", len(got))
	}
}

// Issue 42, item 5: a worker's 40 MiB error text is cut before the
// secret and path expressions run over it: publishing it costs the node
// next to nothing, and a secret cut in two by the bound does not leak
// its start.
func TestPublicTextBoundsTheWorkFirst(t *testing.T) {
	d := &Dispatcher{cfg: Config{Secrets: []string{"s3cr3t-token"}}}
	big := strings.Repeat("/usr/lib/python3/x.py ", 2<<20) // 44 MiB
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	got := d.publicText(big)
	runtime.ReadMemStats(&after)
	if len(got) > maxErrorText {
		t.Fatalf("%d bytes", len(got))
	}
	// Under 1 MiB (a few more with -race, which disables sync.Pool);
	// 155 MiB when the expressions ran over the whole text.
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 8<<20 {
		t.Errorf("a 44 MiB text cost %d bytes", grew)
	}
	// Paths shrink to their last element: text from far beyond the
	// bound would move into the result; a secret cut at the bound must
	// not show its first characters there.
	for cut := 1; cut < len("s3cr3t-token"); cut++ {
		paths := strings.Repeat(" /"+strings.Repeat("a", 200)+"/b", maxErrorScan/204+1)
		text := paths[:maxErrorScan-cut] + "s3cr3t-token and more"
		if got := d.publicText(text); strings.Contains(got, "s3cr3t") || strings.Contains(got, "s3cr") {
			t.Errorf("cut %d: the secret's start shows: %q", cut, got[max(0, len(got)-40):])
		}
	}
}
