package dotnet

import "testing"

func TestTFMRank(t *testing.T) {
	order := []string{"net8.0", "netcoreapp3.1", "netstandard1.3", "netstandard2.0", "netstandard2.1", "net20", "net45", "net462", "net472", "net48"}
	for i := 1; i < len(order); i++ {
		if a, b := tfmRank(order[i-1]), tfmRank(order[i]); a > b || (a == b && a != 0) {
			t.Errorf("rank(%s) = %d, rank(%s) = %d: want increasing", order[i-1], a, order[i], b)
		}
	}
	for _, no := range []string{"net8.0", "net5.0-windows", "netcoreapp3.1", "uap10.0", "net48-foo", "monoandroid"} {
		if r := tfmRank(no); r != 0 {
			t.Errorf("rank(%s) = %d, want 0 (Mono cannot load it)", no, r)
		}
	}
}
