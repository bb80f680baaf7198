package engines

import (
	"context"
	"slices"
	"testing"
)

// named is an engine that only has a name and MIME types.
type named struct {
	name  string
	mimes []string
}

func (n named) Info() Info { return Info{Name: n.name, MIMETypes: n.mimes} }
func (named) Check(context.Context, Spec, []byte) error {
	return nil
}
func (named) Load(context.Context, Spec, []byte) (Instance, error) {
	return nil, nil
}

// MIMETypesOf is what a node advertises: the MIME types of the engines
// named (its healthy ones), an engine registered beside the built-in ones
// included.
func TestMIMETypesOfTheHealthyEngines(t *testing.T) {
	reg := NewRegistry()
	for _, e := range []named{{"python", []string{MIMEPython}}, {"dotnet", []string{MIMECSharp, MIMEDotnetDLL}},
		{"mine", []string{"application/x-mine"}}} {
		if err := reg.Register(e); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := reg.MIMETypesOf([]string{"python", "mine"}), []string{"application/x-mine", MIMEPython}; !slices.Equal(got, want) {
		t.Fatalf("MIMETypesOf(python, mine) = %v, want %v", got, want)
	}
	if got := reg.MIMETypesOf(nil); len(got) != 0 {
		t.Fatalf("MIMETypesOf(none) = %v", got)
	}
}
