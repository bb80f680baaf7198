// Package nativesdk ships the native worker SDK (the C ABI header, the
// FlatBuffers schema and C codec, the shared packaging rules) and the
// project template of `wmctl new --engine native`, which copies them into
// a new worker's folder so that it builds on its own.
package nativesdk

// The Go reader of worker_api.fbs (abi/: the engines' tests' reference,
// and the WebAssembly Go SDK's codec).
//go:generate sh -c "rm -f abi/*.go && flatc --go --go-namespace abi -o . worker_api.fbs"

import (
	"embed"
	"io/fs"
)

//go:embed virtufin_worker_api.h virtufin_fb.h worker_api.fbs package.mk
var files embed.FS

//go:embed templates
var templates embed.FS

// Files holds what a native worker's build needs: virtufin_worker_api.h,
// virtufin_fb.h, worker_api.fbs and package.mk, at the root.
func Files() fs.FS { return files }

// Templates holds the project templates: templates/<kind>/, files named
// <name>.tmpl (text/template).
func Templates() fs.FS {
	sub, err := fs.Sub(templates, "templates")
	if err != nil {
		panic(err)
	}
	return sub
}
