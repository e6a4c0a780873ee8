// Package evict bounds a cache directory's size: the least recently used
// entries go first until the rest fit. The kernel cache (package vmlinux)
// and the initramfs cache (package initramfs) each list their own entries
// (their files, what counts as a use and which entries are too fresh to
// take differ), then share this one loop, which had been written twice.
package evict

import (
	"errors"
	"io/fs"
	"slices"
	"time"
)

// Entry is one entry of a cache: its name (whatever the cache's remove
// function takes), the bytes it counts for and when it was last used.
type Entry struct {
	Name string
	Size int64
	Used time.Time
}

// Oldest removes entries, least recently used first, until total (the
// size of all of them) is at most max. An entry keep reports true for is
// never removed (the entry just written, one in use). remove deletes an
// entry; an entry already gone (fs.ErrNotExist) counts as removed. The
// errors of entries that could not be removed are joined; Oldest goes on
// past them. entries is sorted in place.
func Oldest(entries []Entry, total, max int64, keep func(Entry) bool, remove func(Entry) error) error {
	slices.SortFunc(entries, func(a, b Entry) int { return a.Used.Compare(b.Used) })
	var errs []error
	for _, e := range entries {
		if total <= max {
			break
		}
		if keep(e) {
			continue
		}
		if err := remove(e); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		total -= e.Size
	}
	return errors.Join(errs...)
}
