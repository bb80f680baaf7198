// Package components holds WorkManager's Dapr component manifests (the YAML
// files beside this one, with the reason for each setting) and renders them
// with the values of one environment, so that make run, the tests and a
// deployment run the same configuration.
package components

import (
	"embed"
	"fmt"
	"regexp"
	"strings"
)

//go:embed *.yaml
var files embed.FS

// Names of the manifests.
const (
	PubSub     = "pubsub.yaml"
	StateStore = "statestore.yaml"
)

// Render returns the manifest file with the metadata values in set replaced
// (for example redisHost). Every key of set must be in the manifest.
func Render(file string, set map[string]string) ([]byte, error) {
	b, err := files.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("component manifest %s: %w", file, err)
	}
	s := string(b)
	for k, v := range set {
		re := regexp.MustCompile(`(?m)^(\s*- name: ` + regexp.QuoteMeta(k) + `\n\s*value: ).*$`)
		if !re.MatchString(s) {
			return nil, fmt.Errorf("component manifest %s has no metadata %q", file, k)
		}
		s = re.ReplaceAllString(s, "${1}"+strings.ReplaceAll(quote(v), "$", "$$"))
	}
	return []byte(s), nil
}

func quote(v string) string { return fmt.Sprintf("%q", v) }
