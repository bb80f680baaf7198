// Command native-host hosts one native worker library for the native engine
// in process isolation (engines/native, Config.Isolation = "process" or a
// manifest with "isolation": "process"). The engine starts it with the
// extracted library and two pipes (fd 3: requests, fd 4: responses) and
// talks to it with the FlatBuffers messages of the in-process ABI; a crash
// or a timeout kills only this process, which the engine restarts.
//
// It is not meant to be run by hand. Build it next to the node and give its
// path to the engine (native.Config.HostPath):
//
//	go build -o bin/native-host ./cmd/native-host
//
// The host's logic is engines/native/host (host.Main), which the engine's
// tests also run, re-executing their own binary as the host.
package main

import (
	"os"

	"github.com/virtufin/workmanager/engines/native/host"
)

func main() {
	os.Exit(host.Main(os.Args[1:]))
}
