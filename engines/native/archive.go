package native

import (
	"archive/zip"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// Limits on a worker package (a zip archive). A package beyond any of them
// is refused as invalid code before anything is written to disk.
const (
	// MaxPackageSize bounds the zip archive itself.
	MaxPackageSize = 256 << 20
	// MaxUncompressedSize bounds the sum of the uncompressed sizes of all
	// entries (declared in the archive, and counted while extracting).
	MaxUncompressedSize = 512 << 20
	// MaxEntries bounds the number of entries in the archive.
	MaxEntries = 4096
	// MaxCompressionRatio bounds uncompressed/compressed size of one entry
	// larger than ratioCheckMinSize (zip bombs). Real libraries compress
	// about 2-4x.
	MaxCompressionRatio = 100
	ratioCheckMinSize   = 1 << 20
)

// pkg is a checked worker package.
type pkg struct {
	zr       *zip.Reader
	manifest *Manifest
	rid      string
	lib      *zip.File // the library for rid
}

// openPackage checks a package without writing anything: limits, entry
// names, the manifest and the presence of a library for rid.
func openPackage(code []byte, rid string) (*pkg, error) {
	if len(code) == 0 {
		return nil, invalidf("the package is empty (want a zip archive with %s and runtimes/<rid>/native/)", ManifestName)
	}
	if len(code) > MaxPackageSize {
		return nil, invalidf("the package is %d bytes, more than the limit of %d", len(code), MaxPackageSize)
	}
	zr, err := zip.NewReader(bytes.NewReader(code), int64(len(code)))
	if err != nil && !errors.Is(err, zip.ErrInsecurePath) {
		if kind := libraryKind(code); kind != "" {
			return nil, invalidf("the code is a bare shared library (%s), not a package: a native worker is a zip package with %s at its root "+
				`({"abi_version": %d, "library": "<library>"}) and the library at %s; build it with make package `+
				"(sdk/native/package.mk; sdk/native/README.md, Packaging) or start from wmctl new NAME --engine native",
				kind, ManifestName, CurrentABI, libraryPath(rid, "<library>"))
		}
		return nil, invalidf("the package is not a valid zip archive: %v", err)
	}
	if len(zr.File) > MaxEntries {
		return nil, invalidf("the package has %d entries, more than the limit of %d", len(zr.File), MaxEntries)
	}
	var total uint64
	var manifest *zip.File
	var misplaced string
	for _, f := range zr.File {
		if err := checkEntryName(f.Name); err != nil {
			return nil, err
		}
		if f.Mode()&fs.ModeSymlink != 0 {
			return nil, invalidf("zip entry %q is a symbolic link (not allowed)", f.Name)
		}
		if f.Mode().IsDir() || strings.HasSuffix(f.Name, "/") {
			continue
		}
		size := f.UncompressedSize64
		if size > MaxUncompressedSize || total+size > MaxUncompressedSize {
			return nil, invalidf("the package uncompresses to more than the limit of %d bytes (at entry %q)",
				MaxUncompressedSize, f.Name)
		}
		total += size
		if size > ratioCheckMinSize && (f.CompressedSize64 == 0 || size/f.CompressedSize64 > MaxCompressionRatio) {
			return nil, invalidf("zip entry %q has a compression ratio above the limit of %d (%d bytes from %d): refusing a possible zip bomb",
				f.Name, MaxCompressionRatio, size, f.CompressedSize64)
		}
		switch {
		case f.Name == ManifestName:
			if manifest != nil {
				return nil, invalidf("the package has more than one %s", ManifestName)
			}
			manifest = f
		case path.Base(f.Name) == ManifestName && misplaced == "":
			misplaced = f.Name
		}
	}
	if manifest == nil {
		if misplaced != "" {
			return nil, invalidf("%s is missing at the root of the package (found %q: it must be at the root)", ManifestName, misplaced)
		}
		return nil, invalidf("%s is missing at the root of the package", ManifestName)
	}
	if manifest.UncompressedSize64 > maxManifestSize {
		return nil, invalidf("%s is %d bytes, more than the limit of %d", ManifestName, manifest.UncompressedSize64, maxManifestSize)
	}
	mb, err := readEntry(manifest, maxManifestSize)
	if err != nil {
		return nil, err
	}
	m, err := parseManifest(mb)
	if err != nil {
		return nil, err
	}
	p := &pkg{zr: zr, manifest: m, rid: rid}
	if rid == "" {
		return nil, invalidf("this platform has no runtime identifier (supported: %s)", strings.Join(supportedRIDs(), ", "))
	}
	want := libraryPath(rid, m.Library)
	for _, f := range zr.File {
		if f.Name == want {
			p.lib = f
			break
		}
	}
	if p.lib == nil {
		return nil, invalidf("no library for this platform: %s is not in the package (runtimes present: %s; supported: %s)",
			want, strings.Join(presentRIDs(zr, m.Library), ", "), strings.Join(supportedRIDs(), ", "))
	}
	return p, nil
}

// presentRIDs lists the runtime identifiers with a runtimes/<rid>/native/
// folder in the package, marking those without the manifest's library.
func presentRIDs(zr *zip.Reader, library string) []string {
	seen := map[string]bool{} // rid -> has the library
	for _, f := range zr.File {
		rest, ok := strings.CutPrefix(f.Name, "runtimes/")
		if !ok {
			continue
		}
		rid, rest, ok := strings.Cut(rest, "/")
		if !ok || !strings.HasPrefix(rest, "native/") {
			continue
		}
		if f.Name == libraryPath(rid, library) {
			seen[rid] = true
		} else if _, ok := seen[rid]; !ok {
			seen[rid] = false
		}
	}
	out := make([]string, 0, len(seen))
	for rid, has := range seen {
		if !has {
			rid += fmt.Sprintf(" (without %s)", LibraryFileName(library, ridOS(rid)))
		}
		out = append(out, rid)
	}
	slices.Sort(out)
	if len(out) == 0 {
		out = append(out, "none")
	}
	return out
}

// checkEntryName refuses names that would land outside the extraction
// directory.
func checkEntryName(name string) error {
	n := strings.TrimSuffix(name, "/")
	switch {
	case n == "":
		return invalidf("zip entry with an empty name")
	case strings.ContainsAny(name, "\\\x00"), strings.HasPrefix(name, "/"),
		!filepath.IsLocal(filepath.FromSlash(n)), len(n) >= 2 && n[1] == ':':
		return invalidf("zip entry %q escapes the extraction directory", name)
	}
	return nil
}

// readEntry reads a whole entry, at most limit bytes.
func readEntry(f *zip.File, limit int64) ([]byte, error) {
	rc, err := f.Open()
	if err != nil {
		return nil, invalidf("zip entry %q: %v", f.Name, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, invalidf("zip entry %q: %v", f.Name, err)
	}
	if int64(len(b)) > limit {
		return nil, invalidf("zip entry %q is larger than the limit of %d bytes", f.Name, limit)
	}
	return b, nil
}

// extract writes every file of runtimes/<rid>/native/ into dir (a fresh
// directory) and returns the library's path.
func (p *pkg) extract(dir string) (string, int64, error) {
	prefix := "runtimes/" + p.rid + "/native/"
	var total int64
	for _, f := range p.zr.File {
		rel, ok := strings.CutPrefix(f.Name, prefix)
		if !ok || rel == "" || strings.HasSuffix(f.Name, "/") {
			continue
		}
		dst := filepath.Join(dir, filepath.FromSlash(path.Clean(rel)))
		if r, err := filepath.Rel(dir, dst); err != nil || !filepath.IsLocal(r) {
			return "", 0, invalidf("zip entry %q escapes the extraction directory", f.Name)
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return "", 0, fmt.Errorf("native engine: extracting the package: %w", err)
		}
		n, err := extractFile(f, dst, MaxUncompressedSize-total)
		total += n
		if err != nil {
			return "", total, err
		}
	}
	return filepath.Join(dir, filepath.FromSlash(strings.TrimPrefix(p.lib.Name, prefix))), total, nil
}

func extractFile(f *zip.File, dst string, limit int64) (int64, error) {
	rc, err := f.Open()
	if err != nil {
		return 0, invalidf("zip entry %q: %v", f.Name, err)
	}
	defer rc.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o700)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return 0, invalidf("zip entry %q appears twice", f.Name)
		}
		return 0, fmt.Errorf("native engine: extracting the package: %w", err)
	}
	// Never trust the declared size: count what really comes out.
	n, err := io.Copy(out, io.LimitReader(rc, limit+1))
	if cerr := out.Close(); err == nil && cerr != nil {
		return n, fmt.Errorf("native engine: extracting the package: %w", cerr)
	}
	if err != nil {
		return n, invalidf("zip entry %q: %v", f.Name, err)
	}
	if n > limit {
		return n, invalidf("the package uncompresses to more than the limit of %d bytes (at entry %q)", MaxUncompressedSize, f.Name)
	}
	return n, nil
}

// libraryKind names the shared library format code starts with (ELF,
// Mach-O, PE), or "".
func libraryKind(code []byte) string {
	switch {
	case bytes.HasPrefix(code, []byte("\x7fELF")):
		return "ELF"
	case bytes.HasPrefix(code, []byte{0xcf, 0xfa, 0xed, 0xfe}), bytes.HasPrefix(code, []byte{0xce, 0xfa, 0xed, 0xfe}),
		bytes.HasPrefix(code, []byte{0xca, 0xfe, 0xba, 0xbe}):
		return "Mach-O"
	case bytes.HasPrefix(code, []byte("MZ")):
		return "PE"
	}
	return ""
}
