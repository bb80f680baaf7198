package wasm

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// ABI v1 between the engine and a module (README.md, sdk/wasm/README.md).
const (
	// ABIVersion is what the module's abi_version export returns.
	ABIVersion = 1
	// HostModule is the import module of the engine's host functions.
	HostModule = "workmanager"
	// WASIModule is the only other import module offered (no
	// preopened directory, no sockets, the worker's identity as its
	// environment, a real monotonic clock only).
	WASIModule = wasi_snapshot_preview1.ModuleName

	exportMemory     = "memory"
	exportABIVersion = "abi_version"
	exportAlloc      = "alloc"
	exportDealloc    = "dealloc"
	exportProcess    = "process"
	exportInitialize = "_initialize"
	exportStart      = "_start"
)

// Return codes of the gateway_call host function (those of the native
// ABI, VIRTUFIN_GATEWAY_*).
const (
	GatewayOK          = 0
	GatewayError       = 1
	GatewayUnavailable = 2
	GatewayBadArgs     = 3
)

const (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

// signature is a function type.
type signature struct{ params, results []api.ValueType }

func (s signature) String() string {
	names := func(ts []api.ValueType) string {
		var out []string
		for _, t := range ts {
			out = append(out, api.ValueTypeName(t))
		}
		return "(" + strings.Join(out, ", ") + ")"
	}
	return names(s.params) + " -> " + names(s.results)
}

func sigOf(d api.FunctionDefinition) signature {
	return signature{d.ParamTypes(), d.ResultTypes()}
}

func (s signature) equal(o signature) bool {
	return slices.Equal(s.params, o.params) && slices.Equal(s.results, o.results)
}

// hostFunctions are the engine's host functions and their types.
var hostFunctions = map[string]signature{
	"log":              {[]api.ValueType{i32, i32, i32}, nil},
	"gateway_call":     {[]api.ValueType{i32, i32, i32, i32, i32, i32}, []api.ValueType{i64}},
	"gateway_response": {[]api.ValueType{i32, i32}, []api.ValueType{i32}},
}

// requiredExports are the functions every module exports.
var requiredExports = map[string]signature{
	exportABIVersion: {nil, []api.ValueType{i32}},
	exportAlloc:      {[]api.ValueType{i32}, []api.ValueType{i32}},
	exportDealloc:    {[]api.ValueType{i32}, nil},
	exportProcess:    {[]api.ValueType{i32, i32, i32, i32}, []api.ValueType{i32}},
}

// validate checks a compiled module against the ABI: it imports only what
// is offered (wasi holds the WASI functions, by name), exports its memory
// and the ABI's functions with their types, and is a reactor. The error
// names the first import or export that is wrong.
func validate(cm wazero.CompiledModule, wasi map[string]api.FunctionDefinition) error {
	for _, d := range cm.ImportedFunctions() {
		mod, name, _ := d.Import()
		var want signature
		switch mod {
		case HostModule:
			s, ok := hostFunctions[name]
			if !ok {
				return invalidf("the module imports %s.%s, which is not offered (%s offers %s)", mod, name, HostModule, strings.Join(sortedKeys(hostFunctions), ", "))
			}
			want = s
		case WASIModule:
			wd, ok := wasi[name]
			if !ok {
				return invalidf("the module imports %s.%s, which is not offered", mod, name)
			}
			want = sigOf(wd)
		default:
			return invalidf("the module imports %s.%s, which is not offered: only %q and %q functions are", mod, name, HostModule, WASIModule)
		}
		if got := sigOf(d); !got.equal(want) {
			return invalidf("the module imports %s.%s with type %s, the host offers %s", mod, name, got, want)
		}
	}
	for _, d := range cm.ImportedMemories() {
		mod, name, _ := d.Import()
		return invalidf("the module imports memory %s.%s, which is not offered: a module exports its own memory", mod, name)
	}
	exports := cm.ExportedFunctions()
	for _, name := range sortedKeys(requiredExports) {
		want := requiredExports[name]
		d, ok := exports[name]
		if !ok {
			return invalidf("the module does not export %q (ABI v%d needs %s)", name, ABIVersion, strings.Join(sortedKeys(requiredExports), ", "))
		}
		if got := sigOf(d); !got.equal(want) {
			return invalidf("the module exports %q with type %s, ABI v%d needs %s", name, got, ABIVersion, want)
		}
	}
	if d, ok := exports[exportInitialize]; ok {
		if got := sigOf(d); len(got.params)+len(got.results) != 0 {
			return invalidf("the module exports %q with type %s, want () -> ()", exportInitialize, got)
		}
	} else if _, ok := exports[exportStart]; ok {
		return invalidf("the module is a command (it exports %q), not a reactor: build it with clang -mexec-model=reactor or go build -buildmode=c-shared", exportStart)
	}
	if _, ok := cm.ExportedMemories()[exportMemory]; !ok {
		return invalidf("the module does not export its memory as %q", exportMemory)
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// describeHeader says why code is not a WebAssembly core module, or ""
// when its header is one's.
func describeHeader(code []byte) string {
	switch {
	case len(code) < 8:
		return fmt.Sprintf("%d bytes are not a WebAssembly module (it starts with \"\\x00asm\" and a version)", len(code))
	case string(code[:4]) != "\x00asm":
		return fmt.Sprintf("not a WebAssembly module: it starts with %q, not \"\\x00asm\"", code[:min(len(code), 8)])
	case code[4] != 1 || code[5] != 0 || code[6] != 0 || code[7] != 0:
		return fmt.Sprintf("a WebAssembly binary of version/layer % x, not a core module of version 1 (components are not supported)", code[4:8])
	}
	return ""
}
