package api

import (
	"context"
	"testing"

	"go.temporal.io/sdk/mocks"
	"google.golang.org/grpc/codes"

	"github.com/virtufin/workmanager/engines"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Issue 47 item 2: a group key is a CloudEvent attribute name, and only
// with a group; a bad one is refused before anything is stored, naming
// what is wrong.
func TestCreateRefusesBadGroupKey(t *testing.T) {
	code := &pb.CodeSource{Source: &pb.CodeSource_Content{Content: []byte("def process(e): pass")}}
	for name, c := range map[string]struct{ group, key, want string }{
		"no group":    {key: "subject", want: `group_key "subject" needs a group`},
		"upper case":  {group: "g", key: "Subject", want: `group_key "Subject" has 'S' at position 0`},
		"punctuation": {group: "g", key: "order.id", want: `has '.' at position 5`},
		"too long":    {group: "g", key: "abcdefghijklmnopqrstu", want: "longer than 20 characters"},
	} {
		t.Run(name, func(t *testing.T) {
			s, store := newServer(t, mocks.NewClient(t))
			req := &pb.CreateWorkerRequest{Code: code, MimeType: engines.MIMEPython, Topic: "t", Group: c.group, GroupKey: c.key}
			_, err := s.CreateWorker(context.Background(), req)
			wantCode(t, err, codes.InvalidArgument, c.want)
			if keys := store.Keys(); len(keys) != 0 {
				t.Fatalf("something was stored: %v", keys)
			}
		})
	}
}
