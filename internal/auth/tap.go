package auth

import (
	"context"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// TapHandle checks a call when its stream opens, from its method and
// headers alone, before gRPC reads (and buffers, up to the server's receive
// limit) any of its message: a method no role may call, a call without
// credentials, with a static token that is not listed, with a client
// certificate or token whose principal may not call the method, is refused
// there. A bearer JWT is only checked for its shape here (verifying it may
// fetch keys, which the transport's reader must not wait for); the
// interceptor verifies it, and everything else, again. So an
// unauthenticated client cannot make the API hold message buffers.
func (a *Authenticator) TapHandle() tap.ServerInHandle {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		if a.cfg.Off || a.public[info.FullMethodName] {
			return ctx, nil
		}
		if _, ok := MethodRoles[info.FullMethodName]; !ok {
			return ctx, status.Errorf(codes.PermissionDenied, "%s: no role may call it", info.FullMethodName)
		}
		if a.cfg.JWT != nil && (!a.cfg.ClientCertificates || verifiedClientCert(ctx) == nil) {
			if vals := info.Header.Get("authorization"); len(vals) > 0 {
				if scheme, cred, ok := strings.Cut(vals[0], " "); ok && strings.EqualFold(scheme, "bearer") && strings.Count(strings.TrimSpace(cred), ".") == 2 {
					return ctx, nil // a JWT: verified by the interceptor
				}
			}
		}
		p, err := a.Authenticate(metadata.NewIncomingContext(ctx, info.Header))
		if err != nil {
			return ctx, status.Error(codes.Unauthenticated, err.Error())
		}
		if err := a.authorize(p, info.FullMethodName); err != nil {
			return ctx, err
		}
		return ctx, nil
	}
}
