package devstack

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ProcessCPU is the CPU time (user+system) of process pid and of its
// children so far: live children read from /proc, finished ones as the
// kernel accounted them to pid. Benchmarks read it around a phase to
// report the CPU each server spent per message.
func ProcessCPU(pid int) time.Duration {
	stat := func(p string) (ppid int, self, children int64) {
		raw, err := os.ReadFile("/proc/" + p + "/stat")
		if err != nil {
			return -1, 0, 0
		}
		s := string(raw)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		ppid, _ = strconv.Atoi(f[1])
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		cut, _ := strconv.ParseInt(f[13], 10, 64)
		cst, _ := strconv.ParseInt(f[14], 10, 64)
		return ppid, ut + st, cut + cst
	}
	_, self, dead := stat(strconv.Itoa(pid))
	ticks := self + dead
	if ents, err := os.ReadDir("/proc"); err == nil {
		for _, d := range ents {
			if d.Name()[0] < '0' || d.Name()[0] > '9' {
				continue
			}
			if ppid, t, _ := stat(d.Name()); ppid == pid {
				ticks += t
			}
		}
	}
	return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ is 100
}

// SelfCPU is the CPU time (user+system) of this process so far.
func SelfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
