package loader

import "fmt"

// LibraryFileName is the file name of a library for an operating system
// (GOOS): lib<name>.so, lib<name>.dylib or <name>.dll.
func LibraryFileName(library, goos string) string {
	switch goos {
	case "windows":
		return library + ".dll"
	case "darwin", "ios":
		return "lib" + library + ".dylib"
	default:
		return "lib" + library + ".so"
	}
}

// Exports says which library Open loads and what it resolves; the values
// come from the worker package's manifest.
type Exports struct {
	// Library is the library's base name (for messages).
	Library string
	// File is the library's file name for messages when it is not
	// LibraryFileName(Library) (the native host knows only the path it was
	// given: its base name).
	File string
	// Process and FreeResult are the names of the two exports.
	Process, FreeResult string
	// ABIVersion is the ABI the library was built for (for messages).
	ABIVersion int
}

// LibraryError is a library that cannot be used: it does not load or lacks
// an export. It is the worker's fault (invalid code).
type LibraryError struct{ msg string }

func (e *LibraryError) Error() string { return e.msg }

func libraryErrorf(format string, args ...any) error {
	return &LibraryError{msg: fmt.Sprintf(format, args...)}
}

// fileName is the library's file name in messages.
func (ex Exports) fileName(goos string) string {
	if ex.File != "" {
		return ex.File
	}
	return LibraryFileName(ex.Library, goos)
}
