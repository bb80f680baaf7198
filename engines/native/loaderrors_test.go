//go:build linux || darwin || freebsd

package native

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Load errors that say what to do (issue 44 item 8).

// A library that lacks an export is named by its file name in both modes:
// in process isolation the host got the library's path, and the message
// read "lib/opt/workmanager/package/libecho.so.so".
func TestLibraryErrorsNameTheLibraryFile(t *testing.T) {
	compileAll(t, flagsNoFree)
	code := packageOf(t, flagsNoFree, nil)
	modes(t, func(t *testing.T, cfg Config) {
		e := newTestEngine(t, cfg)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		err := e.Check(ctx, testSpec, code)
		checkInvalid(t, "Check", err, "the library libfixture.so does not export FreeResult")
		if strings.Contains(err.Error(), "/") {
			t.Fatalf("Check = %q: a path in the library's name", err)
		}
	})
}

// C++ without extern "C" exports Process under a mangled name: the error
// says so and how to fix it.
func TestMangledCppExportsGetAHint(t *testing.T) {
	gxx, err := exec.LookPath("g++")
	if err != nil {
		t.Skip("g++ is not on PATH")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "worker.cpp")
	// The header is not included: nothing declares the exports extern "C".
	if err := os.WriteFile(src, []byte(`#include <cstdint>
#include <cstdlib>
struct VirtufinHost;
__attribute__((visibility("default"))) int32_t Process(const VirtufinHost*, const uint8_t*, int32_t, uint8_t** out, int32_t* out_len) { *out = 0; *out_len = 0; return 0; }
__attribute__((visibility("default"))) void FreeResult(uint8_t* p) { free(p); }
`), 0o644); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(dir, "libfixture.so")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, gxx, "-shared", "-fPIC", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("g++: %v\n%s", err, out)
	}
	code := zipOf(t, entry{ManifestName, manifestJSON(nil)}, entry{libraryPath(hostRID, "fixture"), readFile(t, lib)})
	modes(t, func(t *testing.T, cfg Config) {
		err := newTestEngine(t, cfg).Check(ctx, testSpec, code)
		checkInvalid(t, "Check", err, "does not export Process and FreeResult")
		for _, want := range []string{"C++ (mangled) names", "_Z7Process", `extern "C"`} {
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("Check = %q\nwant it to contain %q", err, want)
			}
		}
	})
}

// A bare shared library instead of a package is refused with how to
// package it.
func TestBareLibraryIsRefusedWithHowToPackageIt(t *testing.T) {
	compileAll(t, flagsEcho)
	lib := readFile(t, fixtureLib(t, flagsEcho...))
	err := newTestEngine(t, Config{}).Check(context.Background(), testSpec, lib)
	for _, want := range []string{"a bare shared library", "zip package", "manifest.json", "runtimes/" + hostRID + "/native/lib<library>.so", "make package"} {
		checkInvalid(t, "Check", err, want)
	}
}
