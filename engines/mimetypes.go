package engines

// MIME types of the built-in engines (engines/builtin registers them). They
// live here, in the contract package, so that the control plane can validate
// a request's MIME type without linking any engine.
const (
	MIMEPython    = "text/x-python"
	MIMENativeDLL = "application/x-native-dll"
	MIMECSharp    = "text/x-csharp"
	MIMEDotnetDLL = "application/x-dotnet-dll"
	MIMEWasm      = "application/wasm"
)

// BuiltinMIMETypes lists the MIME types the built-in engines serve, sorted
// (engines/builtin's test keeps it equal to its registry's).
func BuiltinMIMETypes() []string {
	return []string{MIMEWasm, MIMEDotnetDLL, MIMENativeDLL, MIMECSharp, MIMEPython}
}
