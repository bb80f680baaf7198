package dispatch

import (
	"regexp"
	"strings"
)

// Error texts leave the node on shared topics (lifecycle events, dead
// letters) and in the dead-letter store: publicText bounds them and takes
// out what belongs to the node, not to the worker: the node's secrets (the
// values of Config.Secrets, e.g. DAPR_API_TOKEN) and absolute file paths
// (extraction and interpreter directories), of which only the last element
// is kept.

// nodePath is an absolute path of two or more elements that starts a word
// (not the path part of a URL).
var nodePath = regexp.MustCompile(`(^|[\s"'(=\[])(/[^\s"'():,\]/]+){2,}`)

func (d *Dispatcher) publicText(s string) string {
	for _, secret := range d.cfg.Secrets {
		if len(secret) >= 6 {
			s = strings.ReplaceAll(s, secret, "[redacted]")
		}
	}
	s = nodePath.ReplaceAllStringFunc(s, func(m string) string {
		lead := ""
		if m != "" && m[0] != '/' {
			lead, m = m[:1], m[1:]
		}
		return lead + ".../" + m[strings.LastIndexByte(m, '/')+1:]
	})
	if len(s) <= maxErrorText {
		return s
	}
	return s[:maxErrorText-3] + "..."
}
