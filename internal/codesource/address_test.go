package codesource_test

import (
	"net/netip"
	"testing"

	"github.com/virtufin/workmanager/internal/codesource"
)

func TestClassify(t *testing.T) {
	for _, c := range []struct{ addr, class string }{
		// IPv4
		{"8.8.8.8", ""},
		{"93.184.216.34", ""},
		{"1.1.1.1", ""},
		{"0.0.0.0", "unspecified"},
		{"0.1.2.3", "unspecified"},
		{"127.0.0.1", "loopback"},
		{"127.255.255.254", "loopback"},
		{"10.0.0.1", "private"},
		{"10.255.255.255", "private"},
		{"172.16.0.1", "private"},
		{"172.31.255.255", "private"},
		{"172.32.0.1", ""},
		{"172.15.255.255", ""},
		{"192.168.1.1", "private"},
		{"169.254.169.254", "metadata"},
		{"169.254.170.2", "metadata"},
		{"168.63.129.16", "metadata"},
		{"169.254.1.1", "link_local"},
		{"169.254.169.253", "link_local"},
		{"100.64.0.1", "cgnat"},
		{"100.100.100.200", "cgnat"},
		{"100.127.255.255", "cgnat"},
		{"100.128.0.1", ""},
		{"100.63.255.255", ""},
		{"192.0.0.1", "reserved"},
		{"192.0.0.170", "reserved"},
		{"192.0.2.1", "documentation"},
		{"198.51.100.1", "documentation"},
		{"203.0.113.1", "documentation"},
		{"198.18.0.1", "benchmarking"},
		{"198.19.255.255", "benchmarking"},
		{"198.20.0.1", ""},
		{"192.88.99.1", "reserved"},
		{"224.0.0.1", "multicast"},
		{"239.255.255.250", "multicast"},
		{"240.0.0.1", "reserved"},
		{"255.255.255.254", "reserved"},
		{"255.255.255.255", "broadcast"},
		// IPv6
		{"2606:4700:4700::1111", ""},
		{"2001:4860:4860::8888", ""},
		{"::", "unspecified"},
		{"::1", "loopback"},
		{"0:0:0:0:0:0:0:1", "loopback"},
		{"::ffff:127.0.0.1", "ipv4_mapped:loopback"},
		{"::ffff:7f00:1", "ipv4_mapped:loopback"},
		{"::ffff:10.0.0.1", "ipv4_mapped:private"},
		{"::ffff:169.254.169.254", "ipv4_mapped:metadata"},
		{"::ffff:0.0.0.0", "ipv4_mapped:unspecified"},
		{"::ffff:8.8.8.8", ""},
		{"64:ff9b::a00:1", "nat64:private"},
		{"64:ff9b::127.0.0.1", "nat64:loopback"},
		{"64:ff9b::169.254.169.254", "nat64:metadata"},
		{"64:ff9b::808:808", ""},
		{"64:ff9b:1::1", "reserved"},
		{"::127.0.0.1", "ipv4_compatible"},
		{"::a00:1", "ipv4_compatible"},
		{"::ffff:0:7f00:1", "reserved"}, // IPv4-translated (SIIT)
		{"100::1", "discard"},
		{"2001:db8::1", "documentation"},
		{"3fff::1", "documentation"},
		{"2001::1", "transition"},
		{"2001:0:4136:e378:8000:63bf:3fff:fdd2", "transition"},
		{"2002:7f00:1::1", "transition"},
		{"2002:808:808::1", "transition"},
		{"2001:2::1", "benchmarking"},
		{"2001:100::1", "reserved"},
		{"2001:1ff::1", "reserved"},
		{"2001:200::1", ""},
		{"fc00::1", "unique_local"},
		{"fd12:3456::1", "unique_local"},
		{"fd00:ec2::254", "metadata"},
		{"fe80::1", "link_local"},
		{"febf::1", "link_local"},
		{"fec0::1", "site_local"},
		{"ff02::1", "multicast"},
		{"ff05::1:3", "multicast"},
		{"4000::1", "reserved"},
		{"1::1", "reserved"},
		{"fe80::1%eth0", "zone"},
		{"2606:4700::1%eth0", "zone"},
		{"::1%lo", "zone"},
	} {
		if got := codesource.Classify(netip.MustParseAddr(c.addr)); got != c.class {
			t.Errorf("Classify(%s) = %q, want %q", c.addr, got, c.class)
		}
	}
	if got := codesource.Classify(netip.Addr{}); got == "" {
		t.Error("the zero Addr is public")
	}
}

func TestParseLooseIPv4(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"127.0.0.1", "127.0.0.1"},
		{"2130706433", "127.0.0.1"},
		{"0x7f000001", "127.0.0.1"},
		{"0X7F000001", "127.0.0.1"},
		{"017700000001", "127.0.0.1"},
		{"0177.0.0.1", "127.0.0.1"},
		{"0x7f.0.0.1", "127.0.0.1"},
		{"127.1", "127.0.0.1"},
		{"0x7f.1", "127.0.0.1"},
		{"127.0.1", "127.0.0.1"},
		{"10.0.0.1", "10.0.0.1"},
		{"1.2.65535", "1.2.255.255"},
		{"1.16777215", "1.255.255.255"},
		{"4294967295", "255.255.255.255"},
		{"0", "0.0.0.0"},
		{"00", "0.0.0.0"},
		{"0x", "0.0.0.0"},
		{"0x0.0x0.0x0.0x0", "0.0.0.0"},
		{"0000000000000000000000000000000000012", "0.0.0.10"},
		// not IPv4 for inet_aton
		{"", ""},
		{".", ""},
		{"1.2.3.4.5", ""},
		{"256.1.1.1", ""},
		{"1.2.3.256", ""},
		{"1.2.65536", ""},
		{"1.16777216", ""},
		{"4294967296", ""},
		{"99999999999999999999999", ""},
		{"08", ""},
		{"09.1.1.1", ""},
		{"0x1g", ""},
		{"1..2", ""},
		{".1", ""},
		{"1.", ""},
		{"127.0.0.1.", ""},
		{"a.b.c.d", ""},
		{"-1", ""},
		{"+1", ""},
		{"1.2.3.4 ", ""},
		{"code.example", ""},
	} {
		a, ok := codesource.ParseLooseIPv4(c.in)
		got := ""
		if ok {
			got = a.String()
		}
		if got != c.want {
			t.Errorf("ParseLooseIPv4(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestDialControl(t *testing.T) {
	for _, c := range []struct {
		p       codesource.Policy
		addr    string
		refused string // the class, "" if allowed
	}{
		{codesource.Policy{}, "93.184.216.34:443", ""},
		{codesource.Policy{}, "[2606:4700::1111]:443", ""},
		{codesource.Policy{}, "127.0.0.1:80", "loopback"},
		{codesource.Policy{}, "[::1]:80", "loopback"},
		{codesource.Policy{}, "169.254.169.254:80", "metadata"},
		{codesource.Policy{}, "10.0.0.1:80", "private"},
		{codesource.Policy{}, "[::ffff:10.0.0.1]:80", "private"},
		{codesource.Policy{}, "[fe80::1%eth0]:80", "zone"},
		{codesource.Policy{AllowLoopback: true}, "127.0.0.1:80", ""},
		{codesource.Policy{AllowLoopback: true}, "[::1]:80", ""},
		{codesource.Policy{AllowLoopback: true}, "10.0.0.1:80", "private"},
		{codesource.Policy{AllowLoopback: true}, "169.254.169.254:80", "metadata"},
		{codesource.Policy{}, "not an address", "unreadable"},
	} {
		err := codesource.DialControl(c.p)("tcp", c.addr, nil)
		if c.refused == "" {
			if err != nil {
				t.Errorf("control(%s, loopback=%v): %v", c.addr, c.p.AllowLoopback, err)
			}
			continue
		}
		wantRefusal(t, err, "address_class", c.refused)
	}
}
