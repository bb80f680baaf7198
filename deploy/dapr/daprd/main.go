// Command daprd is Dapr's sidecar, v1.14.0, built with -tags stablecomponents.
package main

import "github.com/dapr/dapr/cmd/daprd/app"

func main() { app.Run() }
