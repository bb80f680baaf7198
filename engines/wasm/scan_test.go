package wasm

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
)

// nested is a module whose one function nests depth empty blocks.
func nested(depth int) []byte {
	var body []byte
	for range depth {
		body = append(body, 0x02, 0x40) // block
	}
	for range depth {
		body = append(body, opEnd)
	}
	return abiModule(i32c(0), nil, wasmFunc{typ: 4, body: body})
}

// A module whose blocks nest deeply enough to keep the compiler busy for
// minutes is refused before it is compiled, at once.
func TestDeeplyNestedModuleIsRefusedBeforeCompiling(t *testing.T) {
	e := newTestEngine(t, Config{})
	start := time.Now()
	err := e.Check(bg(t), testSpec("nested", 0), nested(100000))
	if !errors.Is(err, engines.ErrInvalidCode) || !strings.Contains(err.Error(), "nest their blocks too deeply") {
		t.Fatalf("Check(100,000 nested blocks) = %v, want ErrInvalidCode about the nesting", err)
	}
	if took := time.Since(start); took > time.Minute {
		t.Errorf("the refusal took %v", took)
	}
	// Ordinary nesting compiles.
	if err := e.Check(bg(t), testSpec("nested-ok", 0), nested(200)); err != nil {
		t.Fatalf("Check(200 nested blocks) = %v", err)
	}
}

// The scanner reads every instruction real toolchains emit (the example
// workers), and their cost is far from the limit.
func TestScanReadsRealModules(t *testing.T) {
	mods := map[string][]byte{"c-fixture": fixture(t)}
	if !testing.Short() {
		mods["go-pricer"] = buildGo(t, filepath.Join(repoRoot(t), "examples", "wasm", "go-pricer"))
	}
	for name, code := range mods {
		st, err := scanCode(code)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if st.functions == 0 || st.cost > maxCompileCost/16 {
			t.Errorf("%s: %+v, want functions and a cost well under %d", name, st, maxCompileCost)
		}
		t.Logf("%s (%d bytes): %+v", name, len(code), st)
	}
}
