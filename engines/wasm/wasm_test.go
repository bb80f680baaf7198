package wasm

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines/enginetest"
)

func conformanceFixtures(t *testing.T) enginetest.Fixtures {
	return enginetest.Fixtures{
		Echo:    fixture(t),
		Multi:   fixture(t, "MODE_MULTI"),
		None:    fixture(t, "MODE_NONE"),
		Raise:   fixture(t, "MODE_RAISE"),
		Hang:    fixture(t, "MODE_HANG"),
		Invalid: []byte("this is not a WebAssembly module"),
	}
}

func TestConformance(t *testing.T) {
	enginetest.Run(t, enginetest.Harness{
		Engine:   newTestEngine(t, Config{}),
		MIMEType: MIMEType,
		Fixtures: conformanceFixtures(t),
		Wait:     3 * time.Minute,
	})
}

// The same suite with the fixtures written in Go (testdata/gofixture, on
// the Go SDK): the Go toolchain's modules (the Go runtime on WASI) load,
// echo, fail, hang and are stopped like the C ones. One module plays
// every fixture (by the worker's id, which the suite names after it).
func TestConformanceGo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a Go module for wasip1")
	}
	code := buildGo(t, filepath.Join(repoRoot(t), "engines", "wasm", "testdata", "gofixture"))
	enginetest.Run(t, enginetest.Harness{
		Engine:   newTestEngine(t, Config{}),
		MIMEType: MIMEType,
		Fixtures: enginetest.Fixtures{
			Echo: code, Multi: code, None: code, Raise: code, Hang: code,
			Invalid: []byte("\x00asm\x01\x00\x00\x00garbage"),
		},
		Wait: 3 * time.Minute, // Check/Valid compiles the Go runtime: 11 s alone under -race, over a minute beside make test's integration tests
	})
}
