package dotnet

import (
	"archive/zip"
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/virtufin/workmanager/engines"
)

// Package limits: an archive beyond them is refused before anything is
// written.
const (
	maxPackageEntries = 4096
	// maxRatio bounds uncompressed/compressed size of an entry over 1 MiB
	// (zip bombs).
	maxRatio = 100
)

// tfmRE parses a target framework moniker folder name.
var tfmRE = regexp.MustCompile(`^(net|netstandard|netcoreapp)(\d+)(?:\.(\d+))?(?:\.(\d+))?(-[a-z0-9.]+)?$`)

// tfmRank says how well Mono runs assemblies built for tfm: higher is
// better, 0 is "cannot". Mono 6.8 implements .NET Framework 4.8 and
// .NET Standard 2.0 (2.1 mostly); assemblies for .NET Core/5+ reference
// System.Runtime versions it does not have.
func tfmRank(tfm string) int {
	m := tfmRE.FindStringSubmatch(strings.ToLower(tfm))
	if m == nil || m[5] != "" {
		return 0
	}
	switch m[1] {
	case "net":
		// .NET Framework monikers have no dot: net45, net472, net48 (and
		// net20, net35, net40); net5.0 and later do.
		digits := m[2]
		if m[3] != "" || len(digits) < 2 || digits[0] < '2' || digits[0] > '4' {
			return 0
		}
		for len(digits) < 3 {
			digits += "0"
		}
		v, _ := strconv.Atoi(digits[:3])
		return 1000 + v
	case "netstandard":
		major, _ := strconv.Atoi(m[2])
		minor, _ := strconv.Atoi(m[3])
		if major == 2 {
			return 500 + minor
		}
		if major == 1 {
			return 100 + minor
		}
	}
	return 0
}

// unpack checks a package and extracts the chosen lib/<tfm>/ folder into
// <cache>/pkg-<key>/ (cacheKey: the package's content, and its tenant's
// when there is one), unless it is there already. A bare assembly (a
// file starting with "MZ") is taken as a package of that one DLL.
func (rt *runtime) unpack(cache, tenant string, code []byte, maxBytes int64) (*workerCode, error) {
	dir := filepath.Join(cache, "pkg-"+cacheKey(tenant, code))
	if bytes.HasPrefix(code, []byte("MZ")) {
		dll := filepath.Join(dir, "Worker.dll")
		w := &workerCode{assemblies: []string{dll}, probe: []string{dir}, dir: dir}
		if _, err := os.Stat(dll); err == nil {
			return w, nil
		}
		return w, writeDir(cache, dir, map[string][]byte{"Worker.dll": code})
	}
	if len(code) == 0 {
		return nil, invalidf("the package is empty (want a .nupkg-shaped zip with lib/<tfm>/<worker>.dll, or one .NET assembly)")
	}
	zr, err := zip.NewReader(bytes.NewReader(code), int64(len(code)))
	if err != nil {
		return nil, invalidf("the package is neither a .NET assembly nor a valid zip archive: %v", err)
	}
	if len(zr.File) > maxPackageEntries {
		return nil, invalidf("the package has %d entries, more than the limit of %d", len(zr.File), maxPackageEntries)
	}
	byTFM := map[string][]*zip.File{}
	var nuspecID string
	for _, f := range zr.File {
		name := f.Name
		if strings.Contains(name, "\\") || strings.HasPrefix(name, "/") || path.Clean(name) != name && !strings.HasSuffix(name, "/") {
			return nil, invalidf("the package entry %q has an unsafe name", name)
		}
		for _, part := range strings.Split(name, "/") {
			if part == ".." {
				return nil, invalidf("the package entry %q has an unsafe name", name)
			}
		}
		if strings.HasSuffix(name, ".nuspec") && !strings.Contains(name, "/") {
			id, err := readNuspecID(f)
			if err != nil {
				return nil, invalidf("%s: %v", name, err)
			}
			nuspecID = id
		}
		parts := strings.Split(name, "/")
		if len(parts) == 3 && strings.EqualFold(parts[0], "lib") && parts[2] != "" && !f.FileInfo().IsDir() {
			byTFM[parts[1]] = append(byTFM[parts[1]], f)
		}
	}
	if len(byTFM) == 0 {
		return nil, invalidf("the package has no lib/<tfm>/ folder with assemblies (want a .nupkg-shaped zip such as lib/net48/MyWorker.dll)")
	}
	var tfms []string
	for t := range byTFM {
		tfms = append(tfms, t)
	}
	sort.Strings(tfms)
	best, bestRank := "", 0
	for _, t := range tfms {
		if r := tfmRank(t); r > bestRank {
			best, bestRank = t, r
		}
	}
	if best == "" {
		return nil, invalidf("the package targets %s only; this node runs .NET workers on Mono, which loads assemblies built for net4x (net45 to net48) or netstandard2.x: add one of those to the package", "lib/"+strings.Join(tfms, ", lib/"))
	}
	var total int64
	files := map[string][]byte{}
	var dlls []string
	for _, f := range byTFM[best] {
		base := path.Base(f.Name)
		if f.UncompressedSize64 > 1<<20 && f.CompressedSize64 > 0 && f.UncompressedSize64/f.CompressedSize64 > maxRatio {
			return nil, invalidf("the package entry %s compresses more than %d:1", f.Name, maxRatio)
		}
		total += int64(f.UncompressedSize64)
		if total > maxBytes {
			return nil, invalidf("lib/%s/ is larger than %d bytes uncompressed", best, maxBytes)
		}
		b, err := readZipEntry(f, maxBytes)
		if err != nil {
			return nil, invalidf("reading %s: %v", f.Name, err)
		}
		files[base] = b
		if strings.EqualFold(path.Ext(base), ".dll") && !isDevKit(base) {
			dlls = append(dlls, base)
		}
	}
	if len(dlls) == 0 {
		return nil, invalidf("lib/%s/ holds no worker assembly (.dll); %s is provided by the node", best, devKitDLL)
	}
	sort.Strings(dlls)
	// The nuspec's id names the worker assembly; without one, every
	// assembly is searched for the worker class.
	if nuspecID != "" {
		for _, d := range dlls {
			if strings.EqualFold(d, nuspecID+".dll") {
				dlls = []string{d}
				break
			}
		}
	}
	for name := range files {
		if isDevKit(name) {
			delete(files, name) // the host's own copy is the one every worker shares
		}
	}
	w := &workerCode{probe: []string{dir}, dir: dir}
	for _, d := range dlls {
		w.assemblies = append(w.assemblies, filepath.Join(dir, d))
	}
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err == nil {
		return w, nil
	}
	files[".complete"] = nil
	return w, writeDir(cache, dir, files)
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", engines.ErrInvalidCode, fmt.Sprintf(format, args...))
}

func readZipEntry(f *zip.File, limit int64) ([]byte, error) {
	rc, err := f.Open()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("larger than %d bytes", limit)
	}
	return b, nil
}

func readNuspecID(f *zip.File) (string, error) {
	b, err := readZipEntry(f, 1<<20)
	if err != nil {
		return "", err
	}
	var spec struct {
		Metadata struct {
			ID string `xml:"id"`
		} `xml:"metadata"`
	}
	if err := xml.Unmarshal(b, &spec); err != nil {
		return "", fmt.Errorf("not a valid nuspec: %v", err)
	}
	return spec.Metadata.ID, nil
}

// writeDir writes files into dir through a temporary directory renamed into
// place, world-readable (sandboxed hosts run as other users). A dir another
// node completed meanwhile is kept.
func writeDir(cache, dir string, files map[string][]byte) error {
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return fmt.Errorf("dotnet engine: cache directory: %w", err)
	}
	tmp, err := os.MkdirTemp(cache, ".pkg-")
	if err != nil {
		return fmt.Errorf("dotnet engine: cache directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(tmp, name), b, 0o644); err != nil {
			return fmt.Errorf("dotnet engine: extracting the package: %w", err)
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("dotnet engine: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(dir); serr == nil {
			return nil
		}
		return fmt.Errorf("dotnet engine: %w", err)
	}
	return nil
}
