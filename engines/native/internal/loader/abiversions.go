package loader

import (
	"fmt"
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
// Adding v2: add an ABI to abis (its exports and host struct), mark v1
// Deprecated, and switch on ABI.Version where the call or the codec differ.

// CurrentABI is the ABI version new workers should be built for.
const CurrentABI = 1

// Default export names (ABI v1).
const (
	DefaultEntryPoint = "Process"
	DefaultFreeResult = "FreeResult"
)

// manifestName is the worker package's manifest (engines/native
// ManifestName), which declares abi_version, entry_point and free_result:
// the messages name it.
const manifestName = "manifest.json"

// ABI describes one supported ABI version.
type ABI struct {
	Version int
	// Deprecated versions still load but log a warning: they will be
	// refused by the next release.
	Deprecated bool
	// HostStructSize is sizeof(VirtufinHost) for this version.
	HostStructSize int
}

// abis lists the supported ABI versions, newest first.
var abis = []ABI{
	{Version: 1, HostStructSize: hostStructSizeV1},
}

// LookupABI returns the description of a supported version.
func LookupABI(v int) (ABI, bool) {
	for _, a := range abis {
		if a.Version == v {
			return a, true
		}
	}
	return ABI{}, false
}

// CheckABI returns nil for a supported version, or an error saying why the
// manifest's abi_version is refused (callers report it as invalid code).
func CheckABI(v int) error {
	if _, ok := LookupABI(v); ok {
		return nil
	}
	oldest := abis[len(abis)-1].Version
	if v < oldest && v > 0 {
		return fmt.Errorf("%s: abi_version %d is no longer supported (supported: %s); rebuild the worker against the current SDK (ABI %d)",
			manifestName, v, SupportedABIs(), CurrentABI)
	}
	return fmt.Errorf("%s: abi_version %d is not supported (supported: %s)", manifestName, v, SupportedABIs())
}

// SupportedABIs lists the supported versions for a message ("1, 2").
func SupportedABIs() string {
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
