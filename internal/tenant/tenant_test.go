package tenant_test

import (
	"errors"
	"testing"

	"github.com/google/uuid"

	"github.com/virtufin/workmanager/internal/tenant"
)

func TestWorkerIDs(t *testing.T) {
	u := uuid.MustParse("0b8f4a59-2f3e-4f57-8d63-7a1d2c9e5b41")
	for _, c := range []struct {
		tenant, id string
	}{
		{tenant.Default, u.String()},
		{"", u.String()},
		{"acme", "acme." + u.String()},
	} {
		id := tenant.WorkerID(c.tenant, u)
		if id != c.id {
			t.Errorf("WorkerID(%q) = %q, want %q", c.tenant, id, c.id)
		}
		got, gu, ok := tenant.ParseWorkerID(id)
		want := c.tenant
		if want == "" {
			want = tenant.Default
		}
		if !ok || got != want || gu != u || tenant.Of(id) != want {
			t.Errorf("ParseWorkerID(%q) = %q %v %v", id, got, gu, ok)
		}
	}
	for _, bad := range []string{"", "acme", "acme.", "default." + u.String(), "Acme." + u.String(), "a.b." + u.String(),
		"{" + u.String() + "}", "urn:uuid:" + u.String(), "0b8f4a592f3e4f578d637a1d2c9e5b41", "acme.not-a-uuid"} {
		if _, _, ok := tenant.ParseWorkerID(bad); ok {
			t.Errorf("ParseWorkerID(%q) accepted", bad)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, ok := range []string{"a", "acme", "team-7", "x23456789012345678901234567890123456789012345678901234567890123"} {
		if err := tenant.Validate(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "7up", "Acme", "a.b", "a_b", "-a", "x234567890123456789012345678901234567890123456789012345678901234"} {
		if err := tenant.Validate(bad); !errors.Is(err, tenant.ErrInvalid) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestPrefixes(t *testing.T) {
	p, err := tenant.ParsePrefixes(" acme=acme/ , globex= ,")
	if err != nil {
		t.Fatal(err)
	}
	for tn, want := range map[string]string{"acme": "acme/", "globex": "", "initech": "initech.", tenant.Default: ""} {
		if got := p.Of(tn); got != want {
			t.Errorf("prefix of %q = %q, want %q", tn, got, want)
		}
	}
	for _, bad := range []string{"acme", "Acme=a.", "acme=a*", "acme=a.,acme=b."} {
		if _, err := tenant.ParsePrefixes(bad); !errors.Is(err, tenant.ErrInvalid) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if err := tenant.CheckTopic("acme.", "topic", "acme.orders"); err != nil {
		t.Error(err)
	}
	if err := tenant.CheckTopic("acme.", "topic", "globex.orders"); err == nil {
		t.Error("globex.orders accepted under acme.")
	}
}
