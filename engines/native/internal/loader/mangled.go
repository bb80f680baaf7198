package loader

import (
	"debug/elf"
	"fmt"
	"strconv"
	"strings"
)

// maxHintSymbols bounds the dynamic symbols read for a hint: the library
// is the worker's (any size) and the hint is only a courtesy.
const (
	maxHintSymbols = 1 << 16
	maxHintStrings = 4 << 20 // bytes of symbol names
)

// mangledHint says, for exports a library lacks, which it exports under a
// C++ (Itanium-mangled) name instead — C++ without extern "C" — and how
// to fix it; "" when it has none, or is not an ELF file.
func mangledHint(path string, missing []string) string {
	f, err := elf.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	// Bounded before reading: the library is the worker's.
	symtab, strtab := f.Section(".dynsym"), f.Section(".dynstr")
	if symtab == nil || strtab == nil || symtab.Size > maxHintSymbols*uint64(elf.Sym64Size) || strtab.Size > maxHintStrings {
		return ""
	}
	syms, err := f.DynamicSymbols()
	if err != nil {
		return ""
	}
	var found []string
	for _, name := range missing {
		if s := mangledSymbol(syms, name); s != "" {
			found = append(found, s)
		}
	}
	if len(found) == 0 {
		return ""
	}
	return fmt.Sprintf(`; it exports C++ (mangled) names instead: %s. Declare the exports extern "C" `+
		`(include virtufin_worker_api.h, which does, and define them with its exact signatures, or wrap them in extern "C" { ... })`,
		strings.Join(found, ", "))
}

// mangledSymbol is the defined dynamic symbol that is name mangled as a
// free function (_Z<len><name>...) or inside a namespace
// (_ZN...<len><name>E...), or "".
func mangledSymbol(syms []elf.Symbol, name string) string {
	part := strconv.Itoa(len(name)) + name
	for _, s := range syms {
		if s.Section == elf.SHN_UNDEF || elf.ST_TYPE(s.Info) != elf.STT_FUNC {
			continue
		}
		if strings.HasPrefix(s.Name, "_Z"+part) || (strings.HasPrefix(s.Name, "_ZN") && strings.Contains(s.Name, part+"E")) {
			return s.Name
		}
	}
	return ""
}
