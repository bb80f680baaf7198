package codesource

import (
	"net/netip"
	"strings"
)

type classRange struct {
	prefix netip.Prefix
	class  string
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// v4Classes is checked in order: the first prefix containing the address
// names its class.
var v4Classes = []classRange{
	{pfx("0.0.0.0/8"), "unspecified"}, // "this network"
	{pfx("127.0.0.0/8"), "loopback"},
	{pfx("10.0.0.0/8"), "private"},
	{pfx("172.16.0.0/12"), "private"},
	{pfx("192.168.0.0/16"), "private"},
	{pfx("169.254.169.254/32"), "metadata"}, // AWS, GCP, Azure, OpenStack...
	{pfx("169.254.170.2/32"), "metadata"},   // AWS ECS task metadata
	{pfx("168.63.129.16/32"), "metadata"},   // Azure WireServer (public space, host-local service)
	{pfx("169.254.0.0/16"), "link_local"},
	{pfx("100.64.0.0/10"), "cgnat"}, // includes 100.100.100.200 (Alibaba metadata)
	{pfx("192.0.0.0/24"), "reserved"},
	{pfx("192.0.2.0/24"), "documentation"},
	{pfx("198.51.100.0/24"), "documentation"},
	{pfx("203.0.113.0/24"), "documentation"},
	{pfx("198.18.0.0/15"), "benchmarking"},
	{pfx("192.88.99.0/24"), "reserved"}, // former 6to4 relay anycast
	{pfx("255.255.255.255/32"), "broadcast"},
	{pfx("224.0.0.0/4"), "multicast"},
	{pfx("240.0.0.0/4"), "reserved"},
}

// v6Classes is checked in order, after zones, IPv4-mapped and NAT64
// addresses; what none of them names and is outside 2000::/3 (global
// unicast) is "reserved".
var v6Classes = []classRange{
	{pfx("::/128"), "unspecified"},
	{pfx("::1/128"), "loopback"},
	{pfx("::/96"), "ipv4_compatible"},
	{pfx("64:ff9b:1::/48"), "reserved"}, // local-use NAT64
	{pfx("100::/64"), "discard"},
	{pfx("2001:db8::/32"), "documentation"},
	{pfx("3fff::/20"), "documentation"},
	{pfx("2001::/32"), "transition"}, // Teredo
	{pfx("2001:2::/48"), "benchmarking"},
	{pfx("2001::/23"), "reserved"},         // other IETF protocol assignments
	{pfx("2002::/16"), "transition"},       // 6to4
	{pfx("fd00:ec2::254/128"), "metadata"}, // AWS metadata over IPv6
	{pfx("fc00::/7"), "unique_local"},
	{pfx("fe80::/10"), "link_local"},
	{pfx("fec0::/10"), "site_local"},
	{pfx("ff00::/8"), "multicast"},
}

var (
	globalUnicast = pfx("2000::/3")
	nat64         = pfx("64:ff9b::/96")
)

// Classify names the class of an address: "" for public global unicast
// (allowed), else one of
//
//	unspecified     0.0.0.0/8, ::
//	loopback        127.0.0.0/8, ::1
//	private         10/8, 172.16/12, 192.168/16
//	metadata        169.254.169.254, 169.254.170.2, 168.63.129.16, fd00:ec2::254
//	link_local      169.254/16, fe80::/10
//	cgnat           100.64/10 (also 100.100.100.200, Alibaba metadata)
//	reserved        192.0.0/24, 192.88.99/24, 240/4, 64:ff9b:1::/48,
//	                2001::/23, anything outside 2000::/3 not named here
//	documentation   192.0.2/24, 198.51.100/24, 203.0.113/24, 2001:db8::/32, 3fff::/20
//	benchmarking    198.18/15, 2001:2::/48
//	multicast       224/4, ff00::/8
//	broadcast       255.255.255.255
//	ipv4_mapped:C   ::ffff:a.b.c.d whose IPv4 address has class C
//	nat64:C         64:ff9b::a.b.c.d whose IPv4 address has class C
//	ipv4_compatible ::/96 other than :: and ::1
//	transition      2001::/32 (Teredo), 2002::/16 (6to4)
//	unique_local    fc00::/7
//	site_local      fec0::/10
//	discard         100::/64
//	zone            any IPv6 address with a zone
//
// An IPv4-mapped or NAT64 form of a public IPv4 address is public: it is the
// same host. The invalid zero Addr is "unspecified".
func Classify(a netip.Addr) string {
	switch {
	case !a.IsValid():
		return "unspecified"
	case a.Zone() != "":
		return "zone"
	case a.Is4():
		return classify4(a)
	case a.Is4In6():
		return embedded("ipv4_mapped:", a.Unmap())
	case nat64.Contains(a):
		b := a.As16()
		return embedded("nat64:", netip.AddrFrom4([4]byte(b[12:])))
	}
	for _, r := range v6Classes {
		if r.prefix.Contains(a) {
			return r.class
		}
	}
	if !globalUnicast.Contains(a) {
		return "reserved"
	}
	return ""
}

func classify4(a netip.Addr) string {
	for _, r := range v4Classes {
		if r.prefix.Contains(a) {
			return r.class
		}
	}
	return ""
}

func embedded(kind string, v4 netip.Addr) string {
	if c := classify4(v4); c != "" {
		return kind + c
	}
	return ""
}

// parseLooseIPv4 reads s the way inet_aton (and so glibc's getaddrinfo)
// does: 1 to 4 dot-separated parts, each decimal, octal (leading 0) or hex
// (leading 0x or 0X; "0x" alone is 0); every part but the last is one byte,
// the last fills the remaining bytes. "127.1" is 127.0.0.1, "2130706433"
// and "0x7f000001" too.
func parseLooseIPv4(s string) (netip.Addr, bool) {
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	var v uint32
	for i, p := range parts {
		n, ok := parseLoosePart(p)
		if !ok {
			return netip.Addr{}, false
		}
		if i < len(parts)-1 {
			if n > 0xff {
				return netip.Addr{}, false
			}
			v |= uint32(n) << (24 - 8*i)
			continue
		}
		if n > uint64(0xffffffff)>>(8*i) {
			return netip.Addr{}, false
		}
		v |= uint32(n)
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true
}

func parseLoosePart(p string) (uint64, bool) {
	if p == "" {
		return 0, false
	}
	base := uint64(10)
	switch {
	case len(p) >= 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X'):
		base, p = 16, p[2:]
	case len(p) >= 2 && p[0] == '0':
		base, p = 8, p[1:]
	}
	var n uint64
	for i := 0; i < len(p); i++ {
		var d uint64
		switch c := p[i]; {
		case '0' <= c && c <= '9':
			d = uint64(c - '0')
		case 'a' <= c && c <= 'f':
			d = uint64(c-'a') + 10
		case 'A' <= c && c <= 'F':
			d = uint64(c-'A') + 10
		default:
			return 0, false
		}
		if d >= base {
			return 0, false
		}
		if n = n*base + d; n > 0xffffffff {
			return 0, false
		}
	}
	return n, true
}
