// Command sandbox-exec is the first step of every sandboxed worker process
// (engines/sandbox/execstep): it joins the worker's memory cgroup, keeps
// only the descriptors the node passed on purpose, and executes the rest.
package main

import (
	"os"

	"github.com/virtufin/workmanager/engines/sandbox/execstep"
)

func main() { os.Exit(execstep.Main(os.Args[1:])) }
