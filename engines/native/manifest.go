package native

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"runtime"
	"slices"
	"strings"

	"github.com/virtufin/workmanager/engines/native/internal/loader"
)

// ManifestName is the name of the manifest at the root of a worker package.
const ManifestName = "manifest.json"

// Manifest is the decoded manifest.json of a worker package. Unknown fields
// are ignored.
type Manifest struct {
	// ABIVersion is the worker ABI the library was built for (required).
	ABIVersion int
	// Library is the library's base name: "echo" means libecho.so on Linux,
	// libecho.dylib on macOS and echo.dll on Windows (required).
	Library string
	// EntryPoint is the name of the Process export (default "Process").
	EntryPoint string
	// FreeResult is the name of the FreeResult export (default "FreeResult").
	FreeResult string
	// Isolation is "" or IsolationInProcess (the engine's configured mode)
	// or IsolationProcess (this worker asks to run in a child process).
	Isolation Isolation
}

// Default export names: "Process" and "FreeResult".
const (
	DefaultEntryPoint = loader.DefaultEntryPoint
	DefaultFreeResult = loader.DefaultFreeResult
)

// CurrentABI is the ABI version new workers should be built for (1). The
// supported versions and the ABI policy are in internal/loader
// (abiversions.go).
const CurrentABI = loader.CurrentABI

// maxManifestSize bounds manifest.json.
const maxManifestSize = 64 << 10

var (
	libraryNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)
	symbolRE      = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// parseManifest decodes and validates manifest.json.
func parseManifest(b []byte) (*Manifest, error) {
	var raw struct {
		ABIVersion json.RawMessage `json:"abi_version"`
		Library    *string         `json:"library"`
		EntryPoint *string         `json:"entry_point"`
		FreeResult *string         `json:"free_result"`
		Isolation  *string         `json:"isolation"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&raw); err != nil {
		return nil, invalidf("%s is not valid JSON: %v", ManifestName, err)
	}
	if dec.More() {
		return nil, invalidf("%s is not valid JSON: data after the top-level object", ManifestName)
	}
	m := &Manifest{EntryPoint: DefaultEntryPoint, FreeResult: DefaultFreeResult}

	if len(raw.ABIVersion) == 0 || string(raw.ABIVersion) == "null" {
		return nil, invalidf("%s: abi_version is missing (supported: %s)", ManifestName, loader.SupportedABIs())
	}
	if err := json.Unmarshal(raw.ABIVersion, &m.ABIVersion); err != nil {
		return nil, invalidf("%s: abi_version must be an integer, got %s", ManifestName, raw.ABIVersion)
	}
	if err := loader.CheckABI(m.ABIVersion); err != nil {
		return nil, invalidf("%s", err)
	}

	switch {
	case raw.Library == nil:
		return nil, invalidf("%s: library is missing (the library's base name, e.g. \"echo\" for libecho.so)", ManifestName)
	case *raw.Library == "":
		return nil, invalidf("%s: library is empty", ManifestName)
	case !libraryNameRE.MatchString(*raw.Library) || strings.Contains(*raw.Library, ".."):
		return nil, invalidf("%s: library %q is not a valid name (letters, digits, '_', '-' and '.', no path and no \"..\")",
			ManifestName, *raw.Library)
	}
	m.Library = *raw.Library

	for _, f := range []struct {
		name string
		v    *string
		dst  *string
	}{{"entry_point", raw.EntryPoint, &m.EntryPoint}, {"free_result", raw.FreeResult, &m.FreeResult}} {
		if f.v == nil {
			continue
		}
		if !symbolRE.MatchString(*f.v) {
			return nil, invalidf("%s: %s %q is not a valid C symbol name", ManifestName, f.name, *f.v)
		}
		*f.dst = *f.v
	}
	if raw.Isolation != nil {
		switch iso := Isolation(*raw.Isolation); iso {
		case "", IsolationInProcess, IsolationProcess:
			m.Isolation = iso
		default:
			return nil, invalidf("%s: isolation %q is not supported (supported: %q, %q)",
				ManifestName, *raw.Isolation, IsolationInProcess, IsolationProcess)
		}
	}
	return m, nil
}

// LibraryFileName is the file name of the library for an operating system
// (GOOS): lib<name>.so, lib<name>.dylib or <name>.dll.
func LibraryFileName(library, goos string) string { return loader.LibraryFileName(library, goos) }

// rids maps GOOS/GOARCH to the NuGet runtime identifier used in
// runtimes/<rid>/native/.
var rids = map[string]string{
	"linux/amd64":   "linux-x64",
	"linux/arm64":   "linux-arm64",
	"darwin/amd64":  "osx-x64",
	"darwin/arm64":  "osx-arm64",
	"windows/amd64": "win-x64",
	"windows/arm64": "win-arm64",
	"freebsd/amd64": "freebsd-x64",
	"freebsd/arm64": "freebsd-arm64",
}

// RuntimeID returns the NuGet runtime identifier for GOOS/GOARCH, or "".
func RuntimeID(goos, goarch string) string { return rids[goos+"/"+goarch] }

// supportedRIDs lists every runtime identifier the engine knows, sorted.
func supportedRIDs() []string {
	out := make([]string, 0, len(rids))
	for _, r := range rids {
		out = append(out, r)
	}
	slices.Sort(out)
	return out
}

// hostRID is the runtime identifier of the running process.
var hostRID = RuntimeID(runtime.GOOS, runtime.GOARCH)

// libraryPath is the path inside the archive of the library for rid.
func libraryPath(rid, library string) string {
	return "runtimes/" + rid + "/native/" + LibraryFileName(library, ridOS(rid))
}

// ridOS is the GOOS of a runtime identifier.
func ridOS(rid string) string {
	switch {
	case strings.HasPrefix(rid, "win-"):
		return "windows"
	case strings.HasPrefix(rid, "osx-"):
		return "darwin"
	case strings.HasPrefix(rid, "freebsd-"):
		return "freebsd"
	default:
		return "linux"
	}
}

// invalidf returns an error wrapping engines.ErrInvalidCode.
func invalidf(format string, args ...any) error {
	return &invalidError{msg: fmt.Sprintf(format, args...)}
}

func quoteList(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	q := make([]string, len(s))
	for i, v := range s {
		q[i] = fmt.Sprintf("%q", v)
	}
	return strings.Join(q, ", ")
}
