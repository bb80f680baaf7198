// Package host is the native-host process of the native engine's process
// isolation, so that cmd/native-host (and the engine's tests, which run
// their own binary as the host) can share it: Main loads one worker
// library and serves the engine's calls over the pipes of
// engines/native/internal/hostproto. It is not an API for anything else.
package host
