package testenv

import (
	"strings"
	"sync"
	"testing"
)

// TestLockedBufferConcurrent: writers and a reader at once (run with -race)
// lose no write and tear none.
func TestLockedBufferConcurrent(t *testing.T) {
	var b LockedBuffer
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				_, _ = b.Write([]byte("abc\n"))
			}
		}()
	}
	for range 50 {
		if s := b.String(); len(s)%4 != 0 {
			t.Fatalf("torn write: %d bytes", len(s))
		}
	}
	wg.Wait()
	if got := strings.Count(b.String(), "abc\n"); got != 400 {
		t.Fatalf("%d writes kept, want 400", got)
	}
}
