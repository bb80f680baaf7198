package native

import (
	"slices"
	"strconv"
	"strings"
)

// ABI policy
//
// The worker ABI has one version number (manifest abi_version, also passed
// in VirtufinHost.abi_version). A new major version is added when the C
// signatures, the VirtufinHost layout (other than appending fields) or the
// FlatBuffers schema (other than appending fields) change incompatibly.
//
// The engine supports the current version and the previous one for one
// release: when v2 ships, v1 workers keep loading (with a warning in the
// log) for that release and are refused from the next one with an error
// that lists the supported versions. Today v1 is the only version.
//
// Adding v2: add an abiSpec to abis (its exports and host struct), mark v1
// Deprecated, and switch on spec.Version where the call or the codec differ.

// CurrentABI is the ABI version new workers should be built for.
const CurrentABI = 1

// abiSpec describes one supported ABI version.
type abiSpec struct {
	Version int
	// Deprecated versions still load but log a warning: they will be
	// refused by the next release.
	Deprecated bool
	// HostStructSize is sizeof(VirtufinHost) for this version.
	HostStructSize int
}

// abis lists the supported ABI versions, newest first.
var abis = []abiSpec{
	{Version: 1, HostStructSize: hostStructSizeV1},
}

// lookupABI returns the spec of a supported version.
func lookupABI(v int) (abiSpec, bool) {
	for _, a := range abis {
		if a.Version == v {
			return a, true
		}
	}
	return abiSpec{}, false
}

// checkABI returns an invalid-code error for an unsupported version.
func checkABI(v int) error {
	if _, ok := lookupABI(v); ok {
		return nil
	}
	oldest := abis[len(abis)-1].Version
	if v < oldest && v > 0 {
		return invalidf("%s: abi_version %d is no longer supported (supported: %s); rebuild the worker against the current SDK (ABI %d)",
			ManifestName, v, supportedABIList(), CurrentABI)
	}
	return invalidf("%s: abi_version %d is not supported (supported: %s)", ManifestName, v, supportedABIList())
}

func supportedABIList() string {
	vs := make([]int, len(abis))
	for i, a := range abis {
		vs[i] = a.Version
	}
	slices.Sort(vs)
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ", ")
}
