package api

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"
	"go.temporal.io/sdk/mocks"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/auth"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/tenant"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

func as(role auth.Role, t string) context.Context {
	return auth.WithPrincipal(context.Background(), auth.Principal{Subject: "s", Role: role, Tenant: t, Via: "token"})
}

// A worker ref resolves only within the caller's tenant (admins: any); a
// name resolves to the caller's tenant's worker of that name; another
// tenant's worker is answered like one that does not exist.
func TestResolveIsPerTenant(t *testing.T) {
	u := uuid.New()
	acmeID, defID := tenant.WorkerID("acme", u), tenant.WorkerID(tenant.Default, u)
	for _, c := range []struct {
		ctx     context.Context
		ref, id string
		code    codes.Code
	}{
		{as(auth.RoleOperator, "acme"), acmeID, acmeID, codes.OK},
		{as(auth.RoleOperator, "globex"), acmeID, "", codes.NotFound},
		{as(auth.RoleOperator, "acme"), defID, "", codes.NotFound},
		{as(auth.RoleOperator, tenant.Default), defID, defID, codes.OK},
		{as(auth.RoleAdmin, tenant.Default), acmeID, acmeID, codes.OK},
		{as(auth.RoleReader, "acme"), "orders", NameWorkerID("acme", "orders"), codes.OK},
		{as(auth.RoleReader, "globex"), "orders", NameWorkerID("globex", "orders"), codes.OK},
		{context.Background(), "orders", NameWorkerID(tenant.Default, "orders"), codes.OK},
		{as(auth.RoleOperator, "acme"), "default." + u.String(), "", codes.NotFound},
		{as(auth.RoleOperator, "acme"), "", "", codes.InvalidArgument},
	} {
		id, _, err := resolve(c.ctx, c.ref)
		if status.Code(err) != c.code || id != c.id {
			t.Errorf("%v resolves %q: %q %v, want %q %v", caller(c.ctx), c.ref, id, err, c.id, c.code)
		}
		if c.code == codes.NotFound && !strings.Contains(err.Error(), "not found") {
			t.Errorf("%q: %v", c.ref, err)
		}
	}
	if NameWorkerID("acme", "orders") == NameWorkerID("globex", "orders") || NameWorkerID(tenant.Default, "x") != uuid.NewSHA1(nameSpace, []byte("name:x")).String() {
		t.Error("name ids: per tenant, and the default tenant's unchanged")
	}
	if RequestWorkerID("acme", "r1") == RequestWorkerID("globex", "r1") || !strings.HasPrefix(RequestWorkerID("acme", "r1"), "acme.") {
		t.Error("request ids: per tenant, carrying it")
	}
}

// A tenant's new worker stays under its topic prefix, in and out; the
// refusal is PERMISSION_DENIED and touches nothing (the mock client fails
// the test on any call).
func TestCreateHoldsTopicsToTheTenantsPrefix(t *testing.T) {
	s, store := newServer(t, mocks.NewClient(t))
	s.opts.Tenants = tenant.Prefixes{"globex": "gx/"}
	for _, c := range []struct {
		tenant, topic string
		outputs       []string
		want          string
	}{
		{"acme", "orders", nil, `topic "orders" is outside the tenant's topics: it must start with "acme."`},
		{"acme", "acme.orders", []string{"acme.*", "billing"}, `allowed_output_topics entry "billing" is outside`},
		{"globex", "globex.orders", nil, `must start with "gx/"`},
	} {
		_, err := s.CreateWorker(as(auth.RoleOperator, c.tenant), &pb.CreateWorkerRequest{MimeType: "text/x-python", Topic: c.topic,
			AllowedOutputTopics: c.outputs, Code: &pb.CodeSource{Source: &pb.CodeSource_Content{Content: []byte("x")}}})
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s on %s: %v, want %q", c.tenant, c.topic, err, c.want)
		}
	}
	if keys := store.Keys(); len(keys) != 0 {
		t.Errorf("keys written: %v", keys)
	}
	if ws, _ := catalog.New(store).ListWorkers(context.Background()); len(ws) != 0 {
		t.Errorf("workers %v", ws)
	}
}
