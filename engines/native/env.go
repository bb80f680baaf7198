package native

import (
	"os"
	"slices"
	"sync"

	"github.com/virtufin/workmanager/engines/native/internal/hostproto"
)

// Identity environment variables set while a worker is loaded in process
// (VIRTUFIN_WORKER_ID, VIRTUFIN_WORKER_GROUP, VIRTUFIN_WORKER_TOPIC), and
// in a native-host process's environment.
const (
	EnvWorkerID    = hostproto.EnvWorkerID
	EnvWorkerGroup = hostproto.EnvWorkerGroup
	EnvWorkerTopic = hostproto.EnvWorkerTopic
)

var envNames = [3]string{EnvWorkerID, EnvWorkerGroup, EnvWorkerTopic}

// Process-wide environment variables are a weak channel for the worker's
// identity: there is one environment per process, so with several native
// workers loaded in process the variables hold the identity of the most
// recently loaded one that is still loaded, whichever worker reads them;
// setenv racing with getenv on another thread is also undefined behaviour
// in C. They are set for libraries that read them once at load time (in
// their constructors, right after dlopen). Workers should read their
// identity from VirtufinHost (worker_id, worker_group, worker_topic), which
// is exact. In a native-host child process the variables are exact too.
//
// identityEnv keeps a stack of loaded identities: the variables show the
// top one, and when the last worker unloads they go back to the values
// they had before the first load (unset if they were unset).
var identityEnv struct {
	mu      sync.Mutex
	saved   [3]*string // values before the first push
	entries []*envEntry
}

type envEntry struct{ values [3]string }

func pushIdentity(id, group, topic string) *envEntry {
	e := &envEntry{values: [3]string{id, group, topic}}
	identityEnv.mu.Lock()
	defer identityEnv.mu.Unlock()
	if len(identityEnv.entries) == 0 {
		for i, n := range envNames {
			if v, ok := os.LookupEnv(n); ok {
				identityEnv.saved[i] = &v
			} else {
				identityEnv.saved[i] = nil
			}
		}
	}
	identityEnv.entries = append(identityEnv.entries, e)
	applyIdentity(e.values)
	return e
}

func popIdentity(e *envEntry) {
	if e == nil {
		return
	}
	identityEnv.mu.Lock()
	defer identityEnv.mu.Unlock()
	i := slices.Index(identityEnv.entries, e)
	if i < 0 {
		return
	}
	identityEnv.entries = slices.Delete(identityEnv.entries, i, i+1)
	if n := len(identityEnv.entries); n > 0 {
		if i == n { // the top one went away
			applyIdentity(identityEnv.entries[n-1].values)
		}
		return
	}
	for i, n := range envNames {
		if v := identityEnv.saved[i]; v != nil {
			os.Setenv(n, *v)
		} else {
			os.Unsetenv(n)
		}
	}
}

func applyIdentity(v [3]string) {
	for i, n := range envNames {
		os.Setenv(n, v[i])
	}
}
