//go:build unix

package crashjournal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// mapFile opens and locks the journal file, reads what a crash left in it
// and maps it shared, sized for j.opts.Slots.
func (j *Journal) mapFile() (calls []Call, crashed bool, err error) {
	path := filepath.Join(j.dir, JournalFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, false, fmt.Errorf("crash journal: open %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, false, fmt.Errorf("crash journal: %s is in use by another process: give each node on a machine its own NODE_STATE_DIR", path)
		}
		return nil, false, fmt.Errorf("crash journal: lock %s: %w", path, err)
	}
	old, err := io.ReadAll(io.LimitReader(f, int64(MaxSlots+1)*SlotSize))
	if err != nil {
		f.Close()
		return nil, false, fmt.Errorf("crash journal: read %s: %w", path, err)
	}
	calls, clean, _ := parse(old)
	if clean {
		calls = nil // left in native code at a normal stop: not a crash
	}
	crashed = len(calls) > 0
	size := (j.opts.Slots + 1) * SlotSize
	if err := f.Truncate(int64(size)); err != nil {
		f.Close()
		return nil, false, fmt.Errorf("crash journal: size %s: %w", path, err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, false, fmt.Errorf("crash journal: map %s: %w", path, err)
	}
	j.f, j.mem = f, mem
	clear(mem[:SlotSize])
	copy(mem, magic)
	binary.LittleEndian.PutUint32(mem[offSlots:], uint32(j.opts.Slots))
	return calls, crashed, nil
}

func (j *Journal) unmap() error {
	var err error
	if j.mem != nil {
		err = syscall.Munmap(j.mem)
		j.mem = nil
	}
	if j.f != nil {
		if cerr := j.f.Close(); err == nil {
			err = cerr
		}
		j.f = nil
	}
	return err
}
