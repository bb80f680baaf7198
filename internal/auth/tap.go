package auth

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// TapHandle checks a call when its stream opens, from its method and
// headers alone, before gRPC reads (and buffers, up to the server's receive
// limit) any of its message: a method no role may call, a call without
// credentials, with a static token that is not listed, with a bearer JWT
// that does not verify against the keys already loaded (an unknown kid
// included: the tap never fetches keys, see JWTVerifier), with a client
// certificate, token or JWT whose principal may not call the method, is
// refused there. So an unauthenticated client cannot make the API hold
// message buffers. The principal goes with the call's context, and the
// interceptor authorizes it again without verifying twice.
func (a *Authenticator) TapHandle() tap.ServerInHandle {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		if a.cfg.Off || a.public[info.FullMethodName] {
			return ctx, nil
		}
		if _, ok := MethodRoles[info.FullMethodName]; !ok {
			return ctx, status.Errorf(codes.PermissionDenied, "%s: no role may call it", info.FullMethodName)
		}
		p, err := a.Authenticate(metadata.NewIncomingContext(ctx, info.Header))
		if err != nil {
			return ctx, status.Error(codes.Unauthenticated, err.Error())
		}
		if err := a.authorize(p, info.FullMethodName); err != nil {
			return ctx, err
		}
		return context.WithValue(ctx, tapPrincipalKey{}, p), nil
	}
}

// tapPrincipalKey carries the principal the tap authenticated.
type tapPrincipalKey struct{}
