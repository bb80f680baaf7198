package codesource

import (
	"net/netip"
	"syscall"
)

// ParseLooseIPv4 exposes the inet_aton-compatible parser to the tests.
func ParseLooseIPv4(s string) (netip.Addr, bool) { return parseLooseIPv4(s) }

// DialControl exposes the dialer's Control hook for p.
func DialControl(p Policy) func(network, address string, c syscall.RawConn) error {
	return p.control
}
