package childproc

import (
	"syscall"
	"unsafe"
)

// canWaitNoReap: waitExitedNoReap works, so the process group can be killed
// after the leader exits without risking pid reuse.
const canWaitNoReap = true

// waitExitedNoReap blocks until the process exits but leaves it a zombie
// (waitid with WNOWAIT), so its pid (and process group id) stay reserved.
func waitExitedNoReap(pid int) {
	const (
		pPID    = 1
		wNOWAIT = 0x1000000
	)
	var info [128]byte // siginfo_t
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid),
			uintptr(unsafe.Pointer(&info[0])), syscall.WEXITED|wNOWAIT, 0, 0)
		if errno != syscall.EINTR {
			return
		}
	}
}
