// Package layout checks the shape of the module: imports between its
// top-level folders point one way (docs/architecture.md, "Layers").
package layout

import (
	"os/exec"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/virtufin/workmanager/"

// folder is the top-level folder of a package of this module.
func folder(pkg string) string {
	rest := strings.TrimPrefix(pkg, module)
	f, _, _ := strings.Cut(rest, "/")
	return f
}

func TestTopLevelFoldersImportOneWay(t *testing.T) {
	out, err := exec.Command("go", "list", "-test", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, module+"...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	edges := map[[2]string][]string{} // folder pair → one example import
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], module) {
			continue
		}
		from := folder(strings.TrimSuffix(f[0], ".test")) // f[0] is "pkg", "pkg.test" or "pkg" of "pkg [pkg.test]"
		for _, imp := range f[1:] {
			if !strings.HasPrefix(imp, module) { // also skips the "[pkg.test]" of a test variant
				continue
			}
			if to := folder(imp); to != from {
				edges[[2]string{from, to}] = []string{f[0], imp}
			}
		}
	}
	var both []string
	for e, ex := range edges {
		if back, ok := edges[[2]string{e[1], e[0]}]; ok && e[0] < e[1] {
			both = append(both, e[0]+" ⇄ "+e[1]+": "+ex[0]+" → "+ex[1]+", "+back[0]+" → "+back[1])
		}
	}
	sort.Strings(both)
	for _, b := range both {
		t.Error("folders import each other: " + b)
	}
}
