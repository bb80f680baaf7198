//go:build !(linux || darwin || freebsd)

package native

import (
	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/native/internal/loader"
)

func (e *Engine) loadInProcess(engines.Spec, *pkg, loader.ABI) (engines.Instance, error) {
	return nil, loader.ErrUnsupportedOS
}
