package wasm

// A tiny WebAssembly binary writer for hand-assembled test modules (no
// wat2wasm is needed): types, function imports, functions, one memory,
// exports.

type fnType struct{ params, results []byte }

type wasmImport struct {
	module, name string
	typ          int
}

type wasmFunc struct {
	typ  int
	body []byte // the expression, without locals and without the final end
}

type wasmExport struct {
	name string
	kind byte // 0 func, 2 memory
	idx  int
}

type module struct {
	types   []fnType
	imports []wasmImport
	funcs   []wasmFunc
	memMin  int
	memMax  int // < 0: none
	exports []wasmExport
}

// Value types and opcodes used by the tests.
const (
	tI32 = 0x7f
	tI64 = 0x7e

	opUnreachable = 0x00
	opLoop        = 0x03
	opIf          = 0x04
	opEnd         = 0x0b
	opBr          = 0x0c
	opCall        = 0x10
	opDrop        = 0x1a
	opLocalGet    = 0x20
	opI32Load     = 0x28
	opI32Const    = 0x41
	opI64Const    = 0x42
	opI32GtU      = 0x4b
	opMemoryGrow  = 0x40
	opBlockEmpty  = 0x40
)

func uleb(v uint64) []byte {
	var b []byte
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			c |= 0x80
		}
		b = append(b, c)
		if v == 0 {
			return b
		}
	}
}

func sleb(v int64) []byte {
	var b []byte
	for {
		c := byte(v & 0x7f)
		v >>= 7
		done := (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0)
		if !done {
			c |= 0x80
		}
		b = append(b, c)
		if done {
			return b
		}
	}
}

func i32c(v int32) []byte { return append([]byte{opI32Const}, sleb(int64(v))...) }

func name(s string) []byte { return append(uleb(uint64(len(s))), s...) }

func section(id byte, payload []byte) []byte {
	return append(append([]byte{id}, uleb(uint64(len(payload)))...), payload...)
}

func vec(items [][]byte) []byte {
	out := uleb(uint64(len(items)))
	for _, it := range items {
		out = append(out, it...)
	}
	return out
}

func (m module) bytes() []byte {
	out := []byte("\x00asm\x01\x00\x00\x00")
	var types [][]byte
	for _, t := range m.types {
		b := []byte{0x60}
		b = append(b, uleb(uint64(len(t.params)))...)
		b = append(b, t.params...)
		b = append(b, uleb(uint64(len(t.results)))...)
		b = append(b, t.results...)
		types = append(types, b)
	}
	out = append(out, section(1, vec(types))...)
	if len(m.imports) > 0 {
		var imps [][]byte
		for _, im := range m.imports {
			b := append(name(im.module), name(im.name)...)
			b = append(b, 0x00)
			b = append(b, uleb(uint64(im.typ))...)
			imps = append(imps, b)
		}
		out = append(out, section(2, vec(imps))...)
	}
	var fidx [][]byte
	for _, f := range m.funcs {
		fidx = append(fidx, uleb(uint64(f.typ)))
	}
	out = append(out, section(3, vec(fidx))...)
	mem := []byte{0x00}
	if m.memMax >= 0 {
		mem = []byte{0x01}
	}
	mem = append(mem, uleb(uint64(m.memMin))...)
	if m.memMax >= 0 {
		mem = append(mem, uleb(uint64(m.memMax))...)
	}
	out = append(out, section(5, vec([][]byte{mem}))...)
	var exps [][]byte
	for _, e := range m.exports {
		b := append(name(e.name), e.kind)
		b = append(b, uleb(uint64(e.idx))...)
		exps = append(exps, b)
	}
	out = append(out, section(7, vec(exps))...)
	var codes [][]byte
	for _, f := range m.funcs {
		body := append([]byte{0x00}, f.body...) // no locals
		body = append(body, opEnd)
		codes = append(codes, append(uleb(uint64(len(body))), body...))
	}
	out = append(out, section(10, vec(codes))...)
	return out
}

// abiModule is a module that implements ABI v1 by hand: abi_version
// returns 1, alloc returns 1024 (the input must fit in the memory's first
// page), dealloc does nothing, process runs processBody (its locals: 0
// in, 1 in_len, 2 out, 3 out_len; it leaves an i32, the return code). The
// function index of process is 3 plus len(imports); extra functions
// follow it (index 4 + len(imports) ...).
func abiModule(processBody []byte, imports []wasmImport, extra ...wasmFunc) []byte {
	m := module{
		types: []fnType{
			{nil, []byte{tI32}},                            // 0: () -> i32
			{[]byte{tI32}, []byte{tI32}},                   // 1: (i32) -> i32
			{[]byte{tI32}, nil},                            // 2: (i32) -> ()
			{[]byte{tI32, tI32, tI32, tI32}, []byte{tI32}}, // 3: process
			{nil, nil},                      // 4: () -> ()
			{[]byte{tI32, tI32, tI32}, nil}, // 5: log
		},
		imports: imports,
		memMin:  1,
		memMax:  -1,
	}
	base := len(imports)
	m.funcs = []wasmFunc{
		{typ: 0, body: i32c(ABIVersion)},
		{typ: 1, body: i32c(1024)},
		{typ: 2, body: nil},
		{typ: 3, body: processBody},
	}
	m.funcs = append(m.funcs, extra...)
	m.exports = []wasmExport{
		{"memory", 2, 0},
		{"abi_version", 0, base + 0},
		{"alloc", 0, base + 1},
		{"dealloc", 0, base + 2},
		{"process", 0, base + 3},
	}
	return m.bytes()
}
