//go:build !linux

package childproc

// canWaitNoReap is false: without waitid(WNOWAIT) the process group is only
// killed while the leader is known to be alive.
const canWaitNoReap = false

func waitExitedNoReap(pid int) {}
