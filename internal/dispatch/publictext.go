package dispatch

import (
	"regexp"
	"strings"
	"unicode/utf8"
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

// maxErrorScan bounds what publicText reads of a text: its secrets and
// paths are replaced in its first maxErrorScan bytes only (paths shrink,
// so more than maxErrorText of them), never over all of a worker's error
// report, which may be as large as a reply.
const maxErrorScan = 8 * maxErrorText

func (d *Dispatcher) publicText(s string) string {
	cut := false
	if len(s) > maxErrorScan {
		s, cut = cutText(s, maxErrorScan), true
		// A secret cut in two by the bound would not be recognised
		// below: its start is dropped.
		for _, secret := range d.cfg.Secrets {
			if len(secret) >= 6 {
				s = trimSecretStart(s, secret)
			}
		}
	}
	for _, secret := range d.cfg.Secrets {
		if len(secret) >= 6 {
			s = strings.ReplaceAll(s, secret, "[redacted]")
		}
	}
	s = shortenPaths(s)
	if len(s) <= maxErrorText && !cut {
		return s
	}
	return cutText(s, maxErrorText-3) + "..."
}

// maxTraceback bounds the traceback carried by dead letters, error events
// and the log (the engines' bound, wire.MaxErrorTraceback).
const maxTraceback = 16 << 10

// publicTraceback is publicText for a worker's traceback (engines.Traceback):
// the node's secrets and paths taken out the same way, bounded to
// maxTraceback keeping its end (the innermost frames and the exception),
// its first line dropped when it was cut.
func (d *Dispatcher) publicTraceback(s string) string {
	if s == "" {
		return ""
	}
	if len(s) > maxTraceback {
		s = cutTextStart(s, maxTraceback)
		// A secret cut in two by the bound would not be recognised
		// below: its end is dropped with the partial first line.
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			s = s[i+1:]
		}
	}
	for _, secret := range d.cfg.Secrets {
		if len(secret) >= 6 {
			s = strings.ReplaceAll(s, secret, "[redacted]")
		}
	}
	return shortenPaths(s)
}

// shortenPaths keeps only the last element of each absolute path in s.
func shortenPaths(s string) string {
	return nodePath.ReplaceAllStringFunc(s, func(m string) string {
		lead := ""
		if m != "" && m[0] != '/' {
			lead, m = m[:1], m[1:]
		}
		return lead + ".../" + m[strings.LastIndexByte(m, '/')+1:]
	})
}

// cutTextStart is the last at most n bytes of s, not inside a UTF-8
// sequence.
func cutTextStart(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := len(s) - n
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return s[i:]
}

// cutText is s cut to at most n bytes, not inside a UTF-8 sequence.
func cutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// trimSecretStart drops the end of s when it is the start of secret.
func trimSecretStart(s, secret string) string {
	for k := min(len(secret)-1, len(s)); k > 0; k-- {
		if strings.HasSuffix(s, secret[:k]) {
			return s[:len(s)-k]
		}
	}
	return s
}
