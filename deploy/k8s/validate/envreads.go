package validate

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// The environment a command reads, found in its Go source text:
//
//   - r.String("NAME", …), r.Int, r.Float, r.Bool, r.Duration, r.List,
//     r.LogLevel — internal/envconfig's Reader getters, and any other
//     method of r called with a NAME-shaped string first (a getter added
//     later is found too);
//   - r.Services(), r.CodeURLs(), … — Reader methods that read several
//     variables themselves (their names are taken from internal/envconfig);
//   - os.Getenv("NAME"), os.LookupEnv("NAME").
var (
	getterCall = regexp.MustCompile(`\br\.[A-Z][A-Za-z0-9]*\(\s*"([A-Z][A-Z0-9_]*)"`)
	groupCall  = regexp.MustCompile(`\br\.([A-Z][A-Za-z0-9]*)\(\)`)
	osCall     = regexp.MustCompile(`\bos\.(?:Getenv|LookupEnv)\(\s*"([A-Z][A-Z0-9_]*)"`)
	readerFunc = regexp.MustCompile(`(?m)^func \(r \*Reader\) ([A-Z][A-Za-z0-9]*)\(`)
)

// goSources returns the text of dir's non-test Go files.
func goSources(dir string) (map[string]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		out[f] = string(b)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no Go source in %s", dir)
	}
	return out, nil
}

// readerGroups maps each internal/envconfig Reader method to the variables
// its body reads through the getters (Services → TEMPORAL_ADDRESS, …).
func readerGroups(envconfigDir string) (map[string][]string, error) {
	srcs, err := goSources(envconfigDir)
	if err != nil {
		return nil, err
	}
	groups := map[string][]string{}
	for _, src := range srcs {
		locs := readerFunc.FindAllStringSubmatchIndex(src, -1)
		for i, loc := range locs {
			end := len(src)
			if i+1 < len(locs) {
				end = locs[i+1][0]
			}
			// A body ends at the next top-level declaration.
			body := src[loc[1]:end]
			if j := regexp.MustCompile(`(?m)^(func|type|var|const) `).FindStringIndex(body); j != nil {
				body = body[:j[0]]
			}
			name := src[loc[2]:loc[3]]
			for _, m := range getterCall.FindAllStringSubmatch(body, -1) {
				groups[name] = append(groups[name], m[1])
			}
		}
	}
	return groups, nil
}

// EnvReads returns the variables the command in cmdDir reads (its non-test
// Go files), with internal/envconfig's grouped readers expanded.
func EnvReads(cmdDir, envconfigDir string) (map[string]bool, error) {
	groups, err := readerGroups(envconfigDir)
	if err != nil {
		return nil, err
	}
	srcs, err := goSources(cmdDir)
	if err != nil {
		return nil, err
	}
	reads := map[string]bool{}
	for _, src := range srcs {
		for _, re := range []*regexp.Regexp{getterCall, osCall} {
			for _, m := range re.FindAllStringSubmatch(src, -1) {
				reads[m[1]] = true
			}
		}
		for _, m := range groupCall.FindAllStringSubmatch(src, -1) {
			for _, n := range groups[m[1]] {
				reads[n] = true
			}
		}
	}
	return reads, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
