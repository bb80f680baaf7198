package state

import (
	"context"
	"fmt"
	"os"
	"strings"
)

// WithFaultFile returns st whose Puts fail while the file at path lists a
// prefix of their key (one prefix per line; a missing file: no fault). It is
// a test hook for injecting store failures into a running node
// (WM_TEST_STATE_FAULT_FILE), never for production: it reads the file on
// every Put.
func WithFaultFile(st Store, path string) Store { return faultFile{Store: st, path: path} }

type faultFile struct {
	Store
	path string
}

func (f faultFile) Put(ctx context.Context, key string, value []byte, opts PutOptions) error {
	if b, err := os.ReadFile(f.path); err == nil {
		for _, prefix := range strings.Fields(string(b)) {
			if strings.HasPrefix(key, prefix) {
				return fmt.Errorf("state put %q: injected fault (%s lists %q)", key, f.path, prefix)
			}
		}
	}
	return f.Store.Put(ctx, key, value, opts)
}

// WithMaxValueBytes returns st whose Puts of a value over max bytes fail, as
// daprd refuses a save larger than its --max-body-size (the write is not
// made). A test hook for the writes that must fit the store.
func WithMaxValueBytes(st Store, max int) Store { return maxValue{Store: st, max: max} }

type maxValue struct {
	Store
	max int
}

func (m maxValue) Put(ctx context.Context, key string, value []byte, opts PutOptions) error {
	if len(value) > m.max {
		return fmt.Errorf("state put %q: injected fault: %d bytes over the store's limit of %d", key, len(value), m.max)
	}
	return m.Store.Put(ctx, key, value, opts)
}
