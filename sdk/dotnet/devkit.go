// Package dotnetdevkit owns the C# DevKit (the Virtufin.Worker assembly:
// sources in src/) and ships its sources inside the node binary: the .NET
// engine compiles them (AssemblySources) into Virtufin.Worker.dll, which
// every worker assembly references, caches the result under Digest, and
// reports Version.
package dotnetdevkit

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strings"
	"sync"
)

//go:embed src/*.cs
var files embed.FS

// extras are not part of the assembly the node compiles: the test helper
// (testing/, namespace Virtufin.Worker.Testing) and the project templates
// of wmctl new (templates/).
//
//go:embed testing/*.cs templates
var extras embed.FS

// TestingSources returns the C# test helper (Virtufin.Worker.Testing):
// file name to content, to compile into a worker's test program.
func TestingSources() map[string][]byte {
	return readDir(extras, "testing")
}

// Templates holds the project templates of wmctl new: templates/<kind>/,
// files named <name>.tmpl (text/template).
func Templates() fs.FS {
	sub, err := fs.Sub(extras, "templates")
	if err != nil {
		panic(err)
	}
	return sub
}

func readDir(fsys embed.FS, dir string) map[string][]byte {
	entries, err := fsys.ReadDir(dir)
	if err != nil {
		panic(err) // embedded at build time
	}
	out := make(map[string][]byte, len(entries))
	for _, e := range entries {
		b, err := fsys.ReadFile(path.Join(dir, e.Name()))
		if err != nil {
			panic(err)
		}
		out[e.Name()] = b
	}
	return out
}

// SeedNamespace is the namespace of the original DevKit (assembly
// Virtufin.Worker.DevKit): the assembly holds every DevKit type there too,
// JSON types included, so that a source written for the original
// (`using Virtufin.Worker.DevKit;`) compiles unchanged.
const SeedNamespace = "Virtufin.Worker.DevKit"

// seedPrefix names the files of the SeedNamespace copy in AssemblySources.
const seedPrefix = "DevKit."

// AssemblySources returns the sources of the DevKit assembly: Sources, and
// a copy of each in SeedNamespace (file name prefixed "DevKit."): the
// namespaces Virtufin.Worker and Virtufin.Worker.Json become
// Virtufin.Worker.DevKit, `using Virtufin.Worker.Json;` a blank line (line
// numbers stay). The two copies are distinct types; a worker uses one
// (HostBinding in each tells the host how to run it).
func AssemblySources() map[string][]byte {
	out := Sources()
	for name, b := range Sources() {
		out[seedPrefix+name] = seedCopy(b)
	}
	return out
}

// seedCopy is src moved into SeedNamespace.
func seedCopy(src []byte) []byte {
	lines := strings.SplitAfter(string(src), "\n")
	for i, l := range lines {
		body := strings.TrimRight(l, "\r\n")
		end := l[len(body):]
		switch strings.TrimSpace(body) {
		case "namespace Virtufin.Worker", "namespace Virtufin.Worker.Json":
			lines[i] = "namespace " + SeedNamespace + end
		case "using Virtufin.Worker.Json;":
			lines[i] = end
		}
	}
	return []byte(strings.Join(lines, ""))
}

var versionRE = regexp.MustCompile(`(?m)^\s*public const string Version = "([^"]+)";`)

// Sources returns the DevKit's C# sources: file name (no directory) to
// content. The map is the caller's to change.
func Sources() map[string][]byte {
	entries, err := files.ReadDir("src")
	if err != nil {
		panic(err) // embedded at build time
	}
	out := make(map[string][]byte, len(entries))
	for _, e := range entries {
		b, err := files.ReadFile(path.Join("src", e.Name()))
		if err != nil {
			panic(err)
		}
		out[e.Name()] = b
	}
	return out
}

// Version is the DevKit's version: Virtufin.Worker.DevKitInfo.Version in
// src/DevKitInfo.cs.
func Version() string {
	b, err := files.ReadFile("src/DevKitInfo.cs")
	if err != nil {
		panic(err)
	}
	m := versionRE.FindSubmatch(b)
	if m == nil {
		panic("sdk/dotnet: no Version line in src/DevKitInfo.cs")
	}
	return string(m[1])
}

var digestOnce = sync.OnceValue(func() string {
	src := AssemblySources()
	names := make([]string, 0, len(src))
	for n := range src {
		names = append(names, n)
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		fmt.Fprintf(h, "%s\x00%d\x00", n, len(src[n]))
		h.Write(src[n])
	}
	return hex.EncodeToString(h.Sum(nil))
})

// Digest is the hex SHA-256 of AssemblySources (sorted names and
// contents), a cache key for the compiled assembly.
func Digest() string {
	return digestOnce()
}
