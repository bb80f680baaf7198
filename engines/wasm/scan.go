package wasm

import (
	"errors"
	"fmt"
)

// wazero's optimizing compiler takes time quadratic in how deeply a
// function nests its blocks (a 300 KB function of 100,000 nested blocks
// compiles for minutes; Go's own output nests one block per resume point
// of a function, hundreds deep). Before anything is compiled, scanCode
// reads every function body's instructions (the interpreter's
// validation, which is linear, has accepted the module) and sums, per
// function, its deepest nesting times its blocks: a module over
// maxCompileCost is refused as invalid code, so that a CreateWorker
// cannot make the node compile for longer than about a second or two.

// maxCompileCost bounds the sum over a module's functions of (deepest
// nesting × blocks): the Go example worker (3.4 MB) costs about 3·10⁶,
// one function of 16,000 nested blocks 2.6·10⁸ (about a second to
// compile here).
const maxCompileCost = 1 << 28

// codeStats is what scanCode found.
type codeStats struct {
	functions int
	maxDepth  int
	cost      int64 // sum of maxDepth × blocks per function
}

type reader struct {
	b   []byte
	pos int
}

var errTruncated = errors.New("truncated")

func (r *reader) byte() (byte, error) {
	if r.pos >= len(r.b) {
		return 0, errTruncated
	}
	c := r.b[r.pos]
	r.pos++
	return c, nil
}

// leb reads an unsigned or signed LEB128 of at most 10 bytes (only its
// length matters here, except for counts).
func (r *reader) leb() (uint64, error) {
	var v uint64
	for i := 0; i < 10; i++ {
		c, err := r.byte()
		if err != nil {
			return 0, err
		}
		if i < 9 {
			v |= uint64(c&0x7f) << (7 * i)
		}
		if c&0x80 == 0 {
			return v, nil
		}
	}
	return 0, errors.New("LEB128 longer than 10 bytes")
}

func (r *reader) skip(n int) error {
	if n < 0 || r.pos+n > len(r.b) {
		return errTruncated
	}
	r.pos += n
	return nil
}

// scanCode walks the code section of a module.
func scanCode(code []byte) (codeStats, error) {
	var st codeStats
	r := &reader{b: code, pos: 8}
	for r.pos < len(r.b) {
		id, err := r.byte()
		if err != nil {
			return st, err
		}
		size, err := r.leb()
		if err != nil {
			return st, err
		}
		if size > uint64(len(r.b)-r.pos) {
			return st, fmt.Errorf("section %d: %w", id, errTruncated)
		}
		end := r.pos + int(size)
		if id == 10 {
			if err := scanFunctions(&reader{b: r.b[:end], pos: r.pos}, &st); err != nil {
				return st, err
			}
		}
		r.pos = end
	}
	return st, nil
}

func scanFunctions(r *reader, st *codeStats) error {
	n, err := r.leb()
	if err != nil {
		return err
	}
	for i := uint64(0); i < n; i++ {
		size, err := r.leb()
		if err != nil {
			return err
		}
		if size > uint64(len(r.b)-r.pos) {
			return fmt.Errorf("function %d: %w", i, errTruncated)
		}
		end := r.pos + int(size)
		depth, blocks, err := scanBody(&reader{b: r.b[:end], pos: r.pos})
		if err != nil {
			return fmt.Errorf("function %d: %w", i, err)
		}
		st.functions++
		st.maxDepth = max(st.maxDepth, depth)
		st.cost += int64(depth) * int64(blocks)
		r.pos = end
	}
	return nil
}

// scanBody reads one function body and returns its deepest nesting and
// its number of blocks.
func scanBody(r *reader) (maxDepth, blocks int, err error) {
	groups, err := r.leb()
	if err != nil {
		return 0, 0, err
	}
	for range groups {
		if _, err := r.leb(); err != nil {
			return 0, 0, err
		}
		if _, err := r.byte(); err != nil {
			return 0, 0, err
		}
	}
	depth := 1
	memarg := func() error {
		if _, err := r.leb(); err != nil {
			return err
		}
		_, err := r.leb()
		return err
	}
	for r.pos < len(r.b) {
		op, err := r.byte()
		if err != nil {
			return 0, 0, err
		}
		switch {
		case op == 0x02 || op == 0x03 || op == 0x04: // block, loop, if: a block type
			if _, err := r.leb(); err != nil {
				return 0, 0, err
			}
			depth++
			blocks++
			maxDepth = max(maxDepth, depth)
		case op == 0x0b: // end
			depth--
		case op == 0x0c || op == 0x0d || op == 0x10 || (op >= 0x20 && op <= 0x26) || op == 0xd2 || op == 0x41 || op == 0x42:
			// br, br_if, call, local/global/table get/set/tee, ref.func, i32/i64.const
			if _, err := r.leb(); err != nil {
				return 0, 0, err
			}
		case op == 0x0e: // br_table
			n, err := r.leb()
			if err != nil {
				return 0, 0, err
			}
			for range n + 1 {
				if _, err := r.leb(); err != nil {
					return 0, 0, err
				}
			}
		case op == 0x11: // call_indirect
			if _, err := r.leb(); err != nil {
				return 0, 0, err
			}
			if _, err := r.leb(); err != nil {
				return 0, 0, err
			}
		case op == 0x1c: // select t*
			n, err := r.leb()
			if err != nil {
				return 0, 0, err
			}
			if err := r.skip(int(min(n, uint64(len(r.b))))); err != nil {
				return 0, 0, err
			}
		case op >= 0x28 && op <= 0x3e: // loads and stores
			if err := memarg(); err != nil {
				return 0, 0, err
			}
		case op == 0x3f || op == 0x40 || op == 0xd0: // memory.size, memory.grow, ref.null
			if _, err := r.byte(); err != nil {
				return 0, 0, err
			}
		case op == 0x43:
			err = r.skip(4)
		case op == 0x44:
			err = r.skip(8)
		case op == 0xfc:
			err = scanFC(r)
		case op == 0xfd:
			err = scanSIMD(r, memarg)
		case op <= 0x01 || op == 0x05 || op == 0x0f || op == 0x1a || op == 0x1b || (op >= 0x45 && op <= 0xc4) || op == 0xd1:
			// no immediate
		default:
			return 0, 0, fmt.Errorf("instruction 0x%02x at byte %d is not one this engine compiles", op, r.pos-1)
		}
		if err != nil {
			return 0, 0, err
		}
	}
	return maxDepth, blocks, nil
}

// scanFC skips a 0xfc-prefixed instruction (saturating truncations, bulk
// memory, tables).
func scanFC(r *reader) error {
	sub, err := r.leb()
	if err != nil {
		return err
	}
	imms := map[uint64]int{8: 2, 9: 1, 10: 2, 11: 1, 12: 2, 13: 1, 14: 2, 15: 1, 16: 1, 17: 1}[sub]
	if sub > 17 {
		return fmt.Errorf("instruction 0xfc %d is not one this engine compiles", sub)
	}
	for range imms {
		if _, err := r.leb(); err != nil {
			return err
		}
	}
	return nil
}

// scanSIMD skips a 0xfd-prefixed (SIMD) instruction.
func scanSIMD(r *reader, memarg func() error) error {
	sub, err := r.leb()
	if err != nil {
		return err
	}
	switch {
	case sub <= 11 || sub == 92 || sub == 93: // loads, stores, load_zero
		return memarg()
	case sub == 12 || sub == 13: // v128.const, i8x16.shuffle
		return r.skip(16)
	case sub >= 21 && sub <= 34: // extract/replace lane
		return r.skip(1)
	case sub >= 84 && sub <= 91: // load/store lane
		if err := memarg(); err != nil {
			return err
		}
		return r.skip(1)
	case sub <= 0xff:
		return nil
	}
	return fmt.Errorf("instruction 0xfd %d is not one this engine compiles", sub)
}
