package validate

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// daprdDir is the module WorkManager's daprd is built from; its go.mod
// pins the Dapr version the sidecar image runs.
var daprdDir = filepath.Join(repo, "deploy", "dapr", "daprd")

// pinnedDapr returns the directory of the Dapr source that deploy/dapr/daprd
// pins, from the module cache (offline: no download is attempted).
func pinnedDapr(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/dapr/dapr")
	cmd.Dir = daprdDir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOPROXY=off", "GOWORK=off")
	out, err := cmd.CombinedOutput()
	dir := strings.TrimSpace(string(out))
	if err != nil || dir == "" {
		t.Fatalf("the Dapr source pinned by deploy/dapr/daprd/go.mod is not in the module cache (%v: %s): run `cd deploy/dapr/daprd && go mod download`", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "pkg", "runtime", "runtime.go")); err != nil {
		t.Fatalf("pinned Dapr source: %v", err)
	}
	return dir
}

// queued is a component daprd creates by itself in Kubernetes mode,
// without a Component resource.
type queued struct {
	typ  string // e.g. secretstores.kubernetes
	fn   string // the function of pkg/runtime/runtime.go that queues it
	flag string // the runtime config field that turns it off, if any
}

// kubernetesModeComponents reads, from the pinned Dapr's pkg/runtime/runtime.go,
// the components daprd adds in Kubernetes mode on its own: every
// `case modes.KubernetesMode:` branch that builds a ComponentSpec with a
// Type (appendBuiltinSecretStore: secretstores.kubernetes) or picks a
// default name resolver (resolverName = "kubernetes"), each with the
// `if a.runtimeConfig.<flag> { return }` that guards its function.
func kubernetesModeComponents(t *testing.T, dapr string) []queued {
	t.Helper()
	file := filepath.Join(dapr, "pkg", "runtime", "runtime.go")
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []queued
	for _, decl := range f.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok || fn.Body == nil {
			continue
		}
		guard := ""
		for _, st := range fn.Body.List {
			ifs, ok := st.(*ast.IfStmt)
			if !ok || ifs.Init != nil || len(ifs.Body.List) != 1 {
				continue
			}
			if _, ret := ifs.Body.List[0].(*ast.ReturnStmt); !ret {
				continue
			}
			if sel, ok := ifs.Cond.(*ast.SelectorExpr); ok {
				if inner, ok := sel.X.(*ast.SelectorExpr); ok && inner.Sel.Name == "runtimeConfig" {
					guard = sel.Sel.Name
				}
			}
		}
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			cc, ok := n.(*ast.CaseClause)
			if !ok || !isKubernetesMode(cc.List) {
				return true
			}
			for _, st := range cc.Body {
				ast.Inspect(st, func(n ast.Node) bool {
					switch x := n.(type) {
					case *ast.KeyValueExpr:
						if k, ok := x.Key.(*ast.Ident); ok && k.Name == "Type" {
							if s, ok := stringLit(x.Value); ok {
								out = append(out, queued{typ: s, fn: fn.Name.Name, flag: guard})
							}
						}
					case *ast.AssignStmt:
						if len(x.Lhs) == 1 && len(x.Rhs) == 1 {
							if id, ok := x.Lhs[0].(*ast.Ident); ok && id.Name == "resolverName" {
								if s, ok := stringLit(x.Rhs[0]); ok {
									out = append(out, queued{typ: "nameresolution." + s, fn: fn.Name.Name, flag: guard})
								}
							}
						}
					}
					return true
				})
			}
			return true
		})
	}
	return out
}

func isKubernetesMode(list []ast.Expr) bool {
	for _, e := range list {
		if sel, ok := e.(*ast.SelectorExpr); ok && sel.Sel.Name == "KubernetesMode" {
			return true
		}
	}
	return false
}

func stringLit(e ast.Expr) (string, bool) {
	bl, ok := e.(*ast.BasicLit)
	if !ok || bl.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(bl.Value)
	return s, err == nil
}

// registeredComponents reads the component types deploy/dapr/daprd
// registers in every build (files without a //go:build constraint):
// <loader>.DefaultRegistry.RegisterComponent(new, "name") with the loader
// imported from github.com/dapr/dapr/pkg/components/<kind>.
func registeredComponents(t *testing.T) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(daprdDir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files in %s (%v)", daprdDir, err)
	}
	out := map[string]bool{}
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		tagged := false
		for _, cg := range f.Comments {
			for _, c := range cg.List {
				if strings.HasPrefix(c.Text, "//go:build") {
					tagged = true
				}
			}
		}
		if tagged {
			continue
		}
		kinds := map[string]string{} // import name -> component kind
		for _, im := range f.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			if !strings.HasPrefix(p, "github.com/dapr/dapr/pkg/components/") || im.Name == nil {
				continue
			}
			kinds[im.Name.Name] = path.Base(p)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) < 2 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "RegisterComponent" {
				return true
			}
			reg, ok := sel.X.(*ast.SelectorExpr)
			if !ok || reg.Sel.Name != "DefaultRegistry" {
				return true
			}
			pkg, ok := reg.X.(*ast.Ident)
			if !ok || kinds[pkg.Name] == "" {
				return true
			}
			for _, a := range call.Args[1:] {
				if s, ok := stringLit(a); ok {
					out[kinds[pkg.Name]+"."+s] = true
				}
			}
			return true
		})
	}
	return out
}

// sidecarAnnotations maps the fields of the pinned Dapr injector's sidecar
// configuration (pkg/injector/patcher/sidecar.go) to their annotations.
func sidecarAnnotations(t *testing.T, dapr string) map[string]string {
	t.Helper()
	file := filepath.Join(dapr, "pkg", "injector", "patcher", "sidecar.go")
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		st, ok := n.(*ast.StructType)
		if !ok {
			return true
		}
		for _, fld := range st.Fields.List {
			if fld.Tag == nil || len(fld.Names) != 1 {
				continue
			}
			tag, _ := strconv.Unquote(fld.Tag.Value)
			if a := reflect.StructTag(tag).Get("annotation"); a != "" {
				out[fld.Names[0].Name] = a
			}
		}
		return true
	})
	if len(out) < 20 {
		t.Fatalf("%s: found only %d annotated fields; has the injector moved?", file, len(out))
	}
	return out
}

// TestDaprdCanCreateItsBuiltinComponents: in Kubernetes mode daprd 1.14
// queues components of its own (the built-in "kubernetes" secret store,
// appendBuiltinSecretStore; the default name resolver). WorkManager's
// daprd registers only the components it uses (deploy/dapr/daprd/
// components.go), and a component whose type is not registered fails
// without ignoreErrors: daprd exits, and the pod's sidecar crash-loops.
// Each queued component must therefore be registered, or turned off by
// its flag's injector annotation on every pod template of every build.
func TestDaprdCanCreateItsBuiltinComponents(t *testing.T) {
	dapr := pinnedDapr(t)
	q := kubernetesModeComponents(t, dapr)
	found := map[string]bool{}
	for _, c := range q {
		found[c.typ] = true
	}
	// Guards the source scan: the two known ones of Dapr 1.14.
	for _, want := range []string{"secretstores.kubernetes", "nameresolution.kubernetes"} {
		if !found[want] {
			t.Fatalf("%s/pkg/runtime/runtime.go: the scan no longer finds %s among the components queued in Kubernetes mode (found %v); update this test for the pinned Dapr version", dapr, want, q)
		}
	}
	registered := registeredComponents(t)
	if !registered["pubsub.redis"] || !registered["state.redis"] {
		t.Fatalf("deploy/dapr/daprd: the scan of RegisterComponent calls found %v, expected pubsub.redis and state.redis among them", sortedKeys(registered))
	}
	annotations := sidecarAnnotations(t, dapr)
	main, err := os.ReadFile(filepath.Join(daprdDir, "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range q {
		if registered[c.typ] {
			continue
		}
		if c.flag == "" {
			t.Errorf("daprd in Kubernetes mode creates a %s component (%s in pkg/runtime/runtime.go) that nothing turns off, and deploy/dapr/daprd/components.go does not register it: daprd exits at start; register it", c.typ, c.fn)
			continue
		}
		annotation := ""
		field := ""
		for f, a := range annotations {
			if strings.EqualFold(f, c.flag) {
				annotation, field = a, f
			}
		}
		if annotation == "" {
			t.Errorf("%s is queued unless runtimeConfig.%s, which no injector annotation sets: register the type in deploy/dapr/daprd/components.go", c.typ, c.flag)
			continue
		}
		// Our main.go is dapr's cmd/daprd/app/app.go: the flag must still
		// reach the runtime's config.
		if !strings.Contains(string(main), field+": ") || !strings.Contains(string(main), "opts."+field) {
			t.Errorf("deploy/dapr/daprd/main.go does not pass opts.%s to the runtime: %s stays queued whatever the annotation", field, c.typ)
		}
		for dir := range builds {
			b, err := LoadBuild(root, dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range b.Find("Deployment") {
				dep := d.Obj.(*appsv1.Deployment)
				if dep.Spec.Template.Annotations["dapr.io/enabled"] != "true" {
					continue
				}
				if v := dep.Spec.Template.Annotations[annotation]; v != "true" {
					t.Errorf("%s: %s: daprd in Kubernetes mode creates a %s component (%s), which WorkManager's daprd does not register, so daprd exits at start: set the annotation %s: \"true\" (got %q) or register the type in deploy/dapr/daprd/components.go",
						dir, dep.Name, c.typ, c.fn, annotation, v)
				}
			}
		}
	}
}

// TestDaprAnnotationsExistInPinnedDapr: every dapr.io/ annotation the
// manifests may use (daprAnnotations) is one the pinned Dapr's injector
// reads; a misspelt one would be silently ignored.
func TestDaprAnnotationsExistInPinnedDapr(t *testing.T) {
	known := map[string]bool{}
	for _, a := range sidecarAnnotations(t, pinnedDapr(t)) {
		known[a] = true
	}
	// Read by the injector outside the sidecar struct (pkg/injector/
	// annotations: whether to inject at all).
	known["dapr.io/enabled"] = true
	var bad []string
	for a := range daprAnnotations {
		if !known[a] {
			bad = append(bad, a)
		}
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		t.Errorf("daprAnnotations lists annotations the pinned Dapr's injector does not read: %v", bad)
	}
}
