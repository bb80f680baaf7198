package deadletter

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/virtufin/workmanager/internal/state"
)

// ReplaySignatureExtension carries the signature of a replay marker
// (ReplayExtension): an HMAC-SHA256 of the event's source and id, the
// worker the marker names and the topic it is published to, under a key
// that only WorkManager holds (ReplayKeyKey, in its state store). The API
// signs the events it replays; a node honours a marker only with a valid
// signature, so a producer cannot forge one (issue 43 item 11).
const ReplaySignatureExtension = "workmanagerreplaysig"

// ReplayKeyKey is the state key of the replay marker's key: 32 random
// bytes, created by the first API or node that needs it (create-if-absent,
// so all of them agree) and never changed. Whoever can read it can read
// and write every dead letter and delivery record as well.
const ReplayKeyKey = state.KeyPrefix + "replaykey"

// replayKey caches the key once read, and the peer key derived from it.
type replayKey struct {
	mu   sync.Mutex
	key  []byte
	peer []byte
}

// key returns the replay marker's key, creating it if the store has none.
func (s *Store) replayKey(ctx context.Context) ([]byte, error) {
	s.replay.mu.Lock()
	defer s.replay.mu.Unlock()
	if s.replay.key != nil {
		return s.replay.key, nil
	}
	for range 3 {
		it, err := s.st.Get(ctx, ReplayKeyKey)
		if err == nil {
			if len(it.Value) < 32 {
				return nil, fmt.Errorf("replay key %s is %d bytes, want at least 32", ReplayKeyKey, len(it.Value))
			}
			s.replay.key = it.Value
			return it.Value, nil
		}
		if !errors.Is(err, state.ErrNotFound) {
			return nil, fmt.Errorf("read replay key: %w", err)
		}
		k := make([]byte, 32)
		if _, err := rand.Read(k); err != nil {
			return nil, err
		}
		switch err := s.st.Put(ctx, ReplayKeyKey, k, state.PutOptions{IfAbsent: true}); {
		case err == nil:
			s.replay.key = k
			return k, nil
		case !errors.Is(err, state.ErrConflict):
			return nil, fmt.Errorf("create replay key: %w", err)
		}
		// Another API or node created it first: read theirs.
	}
	return nil, errors.New("replay key: created and read back inconsistently")
}

// PeerKey is the key nodes sign their requests to each other with (a
// turn forwarded to the node holding its group, dispatch.ForwardPath):
// derived from the replay key (HMAC-SHA256 of a label of its own), so
// that only whoever can read the replay key — WorkManager's nodes and API
// — can make one, and a signature of one kind is never one of the other.
// Derived once: it signs every forwarded turn on both sides.
func (s *Store) PeerKey(ctx context.Context) ([]byte, error) {
	s.replay.mu.Lock()
	p := s.replay.peer
	s.replay.mu.Unlock()
	if p != nil {
		return p, nil
	}
	k, err := s.replayKey(ctx)
	if err != nil {
		return nil, err
	}
	m := hmac.New(sha256.New, k)
	m.Write([]byte("workmanager peer requests v1"))
	p = m.Sum(nil)
	s.replay.mu.Lock()
	s.replay.peer = p
	s.replay.mu.Unlock()
	return p, nil
}

func replayMAC(key []byte, source, id, worker, topic string) []byte {
	m := hmac.New(sha256.New, key)
	for _, f := range []string{source, id, worker, topic} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		m.Write(n[:])
		m.Write([]byte(f))
	}
	return m.Sum(nil)
}

// SignReplay returns the ReplaySignatureExtension of a replay of event
// (source, id) for worker, published to topic.
func (s *Store) SignReplay(ctx context.Context, source, id, worker, topic string) (string, error) {
	k, err := s.replayKey(ctx)
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(replayMAC(k, source, id, worker, topic)), nil
}

// VerifyReplay reports whether sig is SignReplay's signature of a replay of
// event (source, id) for worker on topic. An error means the key could not
// be read (try again later), not that the signature is wrong.
func (s *Store) VerifyReplay(ctx context.Context, source, id, worker, topic, sig string) (bool, error) {
	k, err := s.replayKey(ctx)
	if err != nil {
		return false, err
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil {
		return false, nil
	}
	return hmac.Equal(got, replayMAC(k, source, id, worker, topic)), nil
}
