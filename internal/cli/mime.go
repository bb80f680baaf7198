package cli

import (
	"archive/zip"
	"bytes"
	"fmt"
	"net/url"
	"path"
	"runtime"
	"strings"

	"github.com/virtufin/workmanager/engines/native"
)

// The MIME types the engines take.
const (
	MIMEPython = "text/x-python"
	MIMECSharp = "text/x-csharp"
	MIMEDotnet = "application/x-dotnet-dll"
	MIMENative = "application/x-native-dll"
	MIMEWasm   = "application/wasm"
)

const askMIME = "pass --mime (" + MIMEPython + ", " + MIMECSharp + ", " + MIMEDotnet + ", " + MIMENative + " or " + MIMEWasm + ")"

// InferMIME tells a worker's MIME type from its file name and, for a zip,
// its content: a manifest.json at the root is a native package
// (sdk/native), a lib/<tfm>/*.dll layout or a .nuspec a .NET package.
func InferMIME(name string, content []byte) (string, error) {
	switch ext := strings.ToLower(path.Ext(name)); ext {
	case ".py":
		return MIMEPython, nil
	case ".cs":
		return MIMECSharp, nil
	case ".dll", ".nupkg":
		return MIMEDotnet, nil
	case ".wasm":
		return MIMEWasm, nil
	case ".zip":
		return zipMIME(name, content)
	case ".so", ".dylib":
		return "", bareLibrary(name)
	default:
		return "", fmt.Errorf("cannot tell the MIME type of %s from its name: %s", name, askMIME)
	}
}

// InferMIMEFromURL tells the MIME type from a URL's path, without fetching
// it (so a .zip cannot be told).
func InferMIMEFromURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("--url: %v", err)
	}
	p := u.Path
	if strings.ToLower(path.Ext(p)) == ".zip" {
		return "", fmt.Errorf("cannot tell what kind of package the archive %s is without fetching it: %s", raw, askMIME)
	}
	return InferMIME(p, nil)
}

func zipMIME(name string, content []byte) (string, error) {
	zr, err := zip.NewReader(bytes.NewReader(content), int64(len(content)))
	if err != nil {
		return "", fmt.Errorf("%s is not a readable zip archive (%v): %s", name, err, askMIME)
	}
	dotnet := false
	for _, f := range zr.File {
		n := strings.TrimPrefix(strings.ReplaceAll(f.Name, `\`, "/"), "./")
		lower := strings.ToLower(n)
		if n == "manifest.json" {
			return MIMENative, nil
		}
		parts := strings.Split(lower, "/")
		if len(parts) == 1 && strings.HasSuffix(lower, ".nuspec") {
			dotnet = true
		}
		if len(parts) == 3 && parts[0] == "lib" && parts[1] != "" && strings.HasSuffix(parts[2], ".dll") {
			dotnet = true
		}
	}
	if dotnet {
		return MIMEDotnet, nil
	}
	return "", fmt.Errorf("%s has neither a manifest.json at its root (native package) nor a lib/<tfm>/*.dll layout or a .nuspec (.NET package): %s", name, askMIME)
}

// bareLibrary says how to package a shared library given as a worker's
// code: the native engine takes a zip package, never a bare library.
func bareLibrary(name string) error {
	base := path.Base(strings.ReplaceAll(name, `\`, "/"))
	lib := strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(base, "lib"), ".so"), ".dylib")
	rid := native.RuntimeID(runtime.GOOS, runtime.GOARCH)
	if rid == "" {
		rid = "linux-x64"
	}
	return fmt.Errorf("%s is a bare shared library: a native worker is uploaded as a zip package, with manifest.json at its root "+
		`({"abi_version": 1, "library": %q}) and the library at runtimes/%s/native/%s; build it with make package `+
		"(sdk/native/package.mk, see sdk/native/README.md, Packaging) or start from a template: wmctl new NAME --engine native",
		base, lib, rid, native.LibraryFileName(lib, ridGOOS(rid)))
}

// ridGOOS is the GOOS of a runtime identifier (linux-x64: linux).
func ridGOOS(rid string) string {
	switch {
	case strings.HasPrefix(rid, "osx-"):
		return "darwin"
	case strings.HasPrefix(rid, "win-"):
		return "windows"
	case strings.HasPrefix(rid, "freebsd-"):
		return "freebsd"
	}
	return "linux"
}
