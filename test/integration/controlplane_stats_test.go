package integration

import "testing"

// cpMedianCI's interval is the pair of order statistics a binomial
// distribution of ½ puts at the level asked: for ten differences at 90 %
// the 2nd and 9th smallest (P(X ≤ 1) = 1.1 %, P(X ≤ 2) = 5.5 %); with too
// few for the level (four: P(X = 0) = 6.25 %), the whole range, not ok.
func TestCPMedianCI(t *testing.T) {
	for _, tc := range []struct {
		name        string
		xs          []float64
		lo, med, hi float64
		ok          bool
	}{
		{"ten", []float64{9, 1, 8, 2, 7, 3, 6, 4, 5, 10}, 2, 5.5, 9, true},
		{"five, the fewest", []float64{5, 1, 3, 2, 4}, 1, 3, 5, true},
		{"four, too few", []float64{4, 1, 3, 2}, 1, 2.5, 4, false},
		{"one", []float64{-4}, -4, -4, -4, false},
		{"twenty", []float64{20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1}, 6, 10.5, 15, true},
	} {
		lo, med, hi, ok := cpMedianCI(tc.xs, 0.90)
		if lo != tc.lo || med != tc.med || hi != tc.hi || ok != tc.ok {
			t.Errorf("%s: [%v, %v, %v] %v, want [%v, %v, %v] %v", tc.name, lo, med, hi, ok, tc.lo, tc.med, tc.hi, tc.ok)
		}
	}
}
