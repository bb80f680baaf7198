package dispatch

import (
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
