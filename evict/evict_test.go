package evict

import (
	"errors"
	"io/fs"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestOldest: the least recently used go first, only until the rest fit;
// kept entries stay; an entry already gone counts as removed; a failed
// removal is reported and the loop goes on to the next.
func TestOldest(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	entries := []Entry{
		{"new", 10, at(50)},
		{"oldest", 10, at(1)},
		{"kept", 10, at(2)},
		{"gone", 10, at(3)},
		{"stuck", 10, at(4)},
		{"mid", 10, at(5)},
		{"newer", 10, at(40)},
	}
	var removed []string
	stuck := errors.New("stuck: busy")
	err := Oldest(entries, 70, 30,
		func(e Entry) bool { return e.Name == "kept" },
		func(e Entry) error {
			removed = append(removed, e.Name)
			switch e.Name {
			case "gone":
				return fs.ErrNotExist
			case "stuck":
				return stuck
			}
			return nil
		})
	// 70 → oldest (60) → gone (50) → stuck fails → mid (40) → newer (30): fits.
	assert.Equal(t, []string{"oldest", "gone", "stuck", "mid", "newer"}, removed)
	assert.ErrorIs(t, err, stuck)

	removed = nil
	assert.NoError(t, Oldest(entries, 30, 30, func(Entry) bool { return false }, func(e Entry) error {
		removed = append(removed, e.Name)
		return nil
	}))
	assert.Empty(t, removed, "nothing goes when the cache fits")
}
