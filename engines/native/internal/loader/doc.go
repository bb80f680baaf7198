// Package loader is the in-process side of the native worker ABI: it loads
// a worker library with purego (dlopen, no cgo), resolves and calls its
// Process and FreeResult exports, builds the VirtufinHost struct in C
// memory and routes the library's host calls (log, gateway_call) to a Go
// Sink. It also holds the table of supported ABI versions and their policy.
// Loading is implemented on Linux, macOS and FreeBSD.
package loader
