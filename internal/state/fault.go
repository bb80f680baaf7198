package state

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
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

// WithHoldFile returns st whose Puts to a key that the file at path lists
// (one key a line, exactly) wait until the file no longer lists it. It is
// a test hook (WM_TEST_STATE_HOLD_FILE), never for production: it lets a
// test pause a node (SIGSTOP) exactly between the checks of a write and
// the write itself, as a node paused by its host could be
// (test/integration TestStaleApplyDoesNotResurrectADeletedWorker).
// While a Put waits, path+".held" holds this process's id; once it has
// gone ahead, path+".done" holds the key and the store's answer. The Put
// that waited goes ahead even when its context ended meanwhile (for at
// most ten seconds): a write already on its way to the store when its
// activity was given up, the late write that conditional writes must
// refuse.
func WithHoldFile(st Store, path string) Store { return holdFile{Store: st, path: path} }

type holdFile struct {
	Store
	path string
}

func (h holdFile) listed(key string) bool {
	b, err := os.ReadFile(h.path)
	return err == nil && slices.Contains(strings.Fields(string(b)), key)
}

func (h holdFile) Put(ctx context.Context, key string, value []byte, opts PutOptions) error {
	if !h.listed(key) {
		return h.Store.Put(ctx, key, value, opts)
	}
	_ = os.WriteFile(h.path+".held", []byte(strconv.Itoa(os.Getpid())), 0o644)
	for h.listed(key) {
		time.Sleep(50 * time.Millisecond)
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	err := h.Store.Put(pctx, key, value, opts)
	_ = os.WriteFile(h.path+".done", []byte(fmt.Sprintf("%s\n%v\n", key, err)), 0o644)
	return err
}
