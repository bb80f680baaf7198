package validate

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// retryDelayProblems checks the Redis pub/sub's retryDelay (our daprd
// component's change 14: a message answered RETRY comes back after it,
// doubling, at most processingTimeout): absent is the component's 1s; it
// must be a duration below processingTimeout ("0" turns it off).
func retryDelayProblems(value string, present bool, processing time.Duration) []string {
	if !present {
		return nil
	}
	d, err := time.ParseDuration(value)
	switch {
	case err != nil || d < 0:
		return []string{fmt.Sprintf("retryDelay %q is not a duration such as 1s (\"0\": a RETRY waits processingTimeout)", value)}
	case d >= processing:
		return []string{fmt.Sprintf("retryDelay %s is not below processingTimeout %s: a RETRY would wait processingTimeout anyway", d, processing)}
	}
	return nil
}

func TestRetryDelayRule(t *testing.T) {
	for name, tc := range map[string]struct {
		value   string
		present bool
		want    string
	}{
		"absent (the component's 1s)": {"", false, ""},
		"the manifests'":              {"1s", true, ""},
		"off":                         {"0", true, ""},
		"not a duration":              {"soon", true, `retryDelay "soon" is not a duration`},
		"negative":                    {"-1s", true, `retryDelay "-1s" is not a duration`},
		"not below the timeout":       {"2m", true, "retryDelay 2m0s is not below processingTimeout 2m0s"},
	} {
		t.Run(name, func(t *testing.T) {
			got := strings.Join(retryDelayProblems(tc.value, tc.present, 120*time.Second), "; ")
			if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}
