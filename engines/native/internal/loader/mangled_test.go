package loader

import (
	"debug/elf"
	"testing"
)

func TestMangledSymbol(t *testing.T) {
	fn := func(name string) elf.Symbol {
		return elf.Symbol{Name: name, Info: elf.ST_INFO(elf.STB_GLOBAL, elf.STT_FUNC), Section: 12}
	}
	undefined := elf.Symbol{Name: "_Z7ProcessPv", Info: elf.ST_INFO(elf.STB_GLOBAL, elf.STT_FUNC), Section: elf.SHN_UNDEF}
	for _, c := range []struct {
		syms []elf.Symbol
		want string
	}{
		{[]elf.Symbol{fn("_Z7ProcessPK12VirtufinHostPKhiPPhPi")}, "_Z7ProcessPK12VirtufinHostPKhiPPhPi"},
		{[]elf.Symbol{fn("_ZN4acme7ProcessEPK12VirtufinHostPKhiPPhPi")}, "_ZN4acme7ProcessEPK12VirtufinHostPKhiPPhPi"},
		{[]elf.Symbol{fn("_Z8Process2v"), fn("Process")}, ""}, // another name; the C name (not missing then)
		{[]elf.Symbol{fn("_Z13ProcessHelperv")}, ""},          // a longer name that starts alike
		{[]elf.Symbol{undefined}, ""},                         // imported, not defined here
	} {
		if got := mangledSymbol(c.syms, "Process"); got != c.want {
			t.Errorf("%v: got %q, want %q", c.syms, got, c.want)
		}
	}
}
