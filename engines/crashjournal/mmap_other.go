//go:build !unix

package crashjournal

import "errors"

func (j *Journal) mapFile() ([]Call, bool, error) {
	return nil, false, errors.New("crash journal: needs a Unix system (shared file mappings)")
}

func (j *Journal) unmap() error { return nil }
