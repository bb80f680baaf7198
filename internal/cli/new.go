package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"text/template"

	"github.com/spf13/cobra"

	dotnetsdk "github.com/virtufin/workmanager/sdk/dotnet"
	nativesdk "github.com/virtufin/workmanager/sdk/native"
	pydevkit "github.com/virtufin/workmanager/sdk/python"
)

// projectNameRE is a new worker's name: also its folder, its topic and the
// prefix of its event types.
var projectNameRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,62}$`)

// project is what the templates are filled with.
type project struct {
	Name    string // orders-quote
	Class   string // OrdersQuote: the C# class
	Library string // orders_quote: the native library's base name
	Wmctl   string // the wmctl that wrote the project, for its Makefile
}

func (a *app) newCmd() *cobra.Command {
	var engine, kind, dir string
	cmd := &cobra.Command{
		Use:   "new NAME --engine csharp|native|python [flags]",
		Short: "Write a new worker project from a template: code, tests, a sample event",
		Long: `Write a new worker project into DIR/NAME (--dir, default the current
directory) from a template that passes its own tests. NAME is lower-case
letters, digits and '-', starting with a letter; existing files are never
overwritten.

  --engine csharp  NAME/<Class>.cs (a WorkerBase), <Class>Tests.cs (unit
                   tests with Virtufin.Worker.Testing), event.json,
                   expected.json, a Makefile (make test: the unit tests on
                   Mono; make run: wmctl run on event.json, checked against
                   expected.json) and devkit/ (the C# DevKit's sources and
                   its test helper, so the project builds on its own).
  --engine native  NAME/worker.c, manifest.json, event.json, expected.json,
                   a Makefile (make package: build/NAME.zip; make test: the
                   package through wmctl run, checked against expected.json)
                   and sdk/ (the C ABI header, the C codec, package.mk).
  --engine python  the Python DevKit's template (python -m virtufin_worker new,
                   --kind plain|command|api): worker.py, test_worker.py,
                   event.json; run with wmctl run worker.py --event event.json.`,
		Example: `  wmctl new greeter --engine csharp && make -C greeter check
  wmctl new echo --engine native --dir workers && make -C workers/echo test
  wmctl new quotes --engine python --kind api`,
		Args: cobra.ExactArgs(1),
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if !projectNameRE.MatchString(name) || strings.HasSuffix(name, "-") {
				return usageErr(fmt.Errorf("NAME %q: use lower-case letters, digits and '-', starting with a letter (at most 63)", name))
			}
			if kind != "" && engine != "python" {
				return usageErr(errors.New("--kind is for --engine python"))
			}
			p := project{Name: name, Class: className(name), Library: strings.ReplaceAll(name, "-", "_"), Wmctl: "wmctl"}
			if exe, err := os.Executable(); err == nil {
				p.Wmctl = exe
			}
			target := filepath.Join(dir, name)
			var files map[string][]byte
			var err error
			switch engine {
			case "csharp":
				files, err = renderTemplates(dotnetsdk.Templates(), "worker", p, map[string]string{
					"Worker.cs": p.Class + ".cs", "WorkerTests.cs": p.Class + "Tests.cs"})
				for n, b := range dotnetsdk.AssemblySources() { // both namespaces, as the node's DevKit
					files["devkit/"+n] = b
				}
				for n, b := range dotnetsdk.TestingSources() {
					files["devkit/testing/"+n] = b
				}
			case "native":
				files, err = renderTemplates(nativesdk.Templates(), "worker", p, nil)
				if err == nil {
					err = fs.WalkDir(nativesdk.Files(), ".", func(n string, d fs.DirEntry, err error) error {
						if err != nil || d.IsDir() {
							return err
						}
						files["sdk/"+n], err = fs.ReadFile(nativesdk.Files(), n)
						return err
					})
				}
			case "python":
				return a.newPython(name, kind, dir)
			default:
				return usageErr(fmt.Errorf("--engine %q: use csharp, native or python", engine))
			}
			if err != nil {
				return err
			}
			if err := writeProject(target, files); err != nil {
				return err
			}
			names := make([]string, 0, len(files))
			for n := range files {
				if !strings.Contains(n, "/") {
					names = append(names, n)
				}
			}
			sort.Strings(names)
			fmt.Fprintf(a.io.Out, "wrote %s: %s (and %s)\n", target, strings.Join(names, ", "),
				map[string]string{"csharp": "devkit/", "native": "sdk/"}[engine])
			next := map[string]string{
				"csharp": "make -C " + target + " check   # unit tests on Mono, then wmctl run on event.json",
				"native": "make -C " + target + " test    # build/" + name + ".zip through wmctl run on event.json",
			}[engine]
			fmt.Fprintln(a.io.Out, "next: "+next)
			return nil
		}),
	}
	f := cmd.Flags()
	f.StringVar(&engine, "engine", "", "csharp, native or python (required)")
	f.StringVar(&kind, "kind", "", "python only: plain, command or api (the DevKit's default: plain)")
	f.StringVar(&dir, "dir", ".", "the folder to write NAME/ into")
	_ = cmd.MarkFlagRequired("engine")
	return cmd
}

// className is NAME in PascalCase: orders-quote is OrdersQuote.
func className(name string) string {
	var b strings.Builder
	for _, part := range strings.Split(name, "-") {
		if part != "" {
			b.WriteString(strings.ToUpper(part[:1]) + part[1:])
		}
	}
	s := b.String()
	if s != "" && s[0] >= '0' && s[0] <= '9' {
		s = "W" + s
	}
	return s
}

// renderTemplates fills every <file>.tmpl of fsys/kind with p, named
// <file> or by rename.
func renderTemplates(fsys fs.FS, kind string, p project, rename map[string]string) (map[string][]byte, error) {
	entries, err := fs.ReadDir(fsys, kind)
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".tmpl") {
			continue
		}
		src, err := fs.ReadFile(fsys, path.Join(kind, e.Name()))
		if err != nil {
			return nil, err
		}
		t, err := template.New(e.Name()).Option("missingkey=error").Parse(string(src))
		if err != nil {
			return nil, fmt.Errorf("template %s: %w", e.Name(), err)
		}
		var buf bytes.Buffer
		if err := t.Execute(&buf, p); err != nil {
			return nil, fmt.Errorf("template %s: %w", e.Name(), err)
		}
		name := strings.TrimSuffix(e.Name(), ".tmpl")
		if r, ok := rename[name]; ok {
			name = r
		}
		out[name] = buf.Bytes()
	}
	return out, nil
}

// writeProject writes files under dir, none of which may exist yet.
func writeProject(dir string, files map[string][]byte) error {
	for n := range files {
		if _, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(n))); err == nil {
			return usageErr(fmt.Errorf("%s exists already: wmctl new does not overwrite files (pick another NAME or --dir)", filepath.Join(dir, n)))
		}
	}
	for n, b := range files {
		p := filepath.Join(dir, filepath.FromSlash(n))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// newPython runs the Python DevKit's own template command (python -m
// virtufin_worker new), from a copy of the DevKit this wmctl ships.
func (a *app) newPython(name, kind, dir string) error {
	python, err := exec.LookPath("python3")
	if err != nil {
		return fmt.Errorf("--engine python needs python3 on PATH: %w", err)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	kit, err := pydevkit.Install(filepath.Join(cache, "workmanager", "python"))
	if err != nil {
		return err
	}
	args := []string{"-m", "virtufin_worker", "new", name, "--dir", dir}
	if kind != "" {
		args = append(args, "--kind", kind)
	}
	c := exec.Command(python, args...)
	c.Env = append(os.Environ(), "PYTHONPATH="+kit)
	c.Stdout, c.Stderr = a.io.Out, a.io.Err
	if err := c.Run(); err != nil {
		return &localError{code: ExitUsage, err: fmt.Errorf("python -m virtufin_worker new: %w", err)}
	}
	return nil
}
