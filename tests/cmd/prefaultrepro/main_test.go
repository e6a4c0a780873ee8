package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseFlags(t *testing.T) {
	c, err := parseFlags([]string{"-size", "2", "-pages", "1G", "-workers", "1,16", "-strategies", "populate,fallocate", "-chunk", "16", "-mbind", "0", "-reuse"})
	require.NoError(t, err)
	assert.Equal(t, 2, c.sizeGiB)
	assert.Equal(t, []uint64{gib}, c.pages)
	assert.Equal(t, []int{1, 16}, c.workers)
	assert.Equal(t, []string{"populate", "fallocate"}, c.strategies)
	assert.Equal(t, uint64(16*mib), c.chunk)
	assert.Equal(t, 0, c.mbind)
	assert.True(t, c.reuse)

	c, err = parseFlags(nil)
	require.NoError(t, err)
	assert.Equal(t, 1, c.workers[0], "default worker counts start at 1")
	assert.Equal(t, len(c.cpus), c.workers[len(c.workers)-1], "and end at every CPU this process may use")

	for _, bad := range [][]string{{"-size", "0"}, {"-pages", "4K"}, {"-strategies", "memset"}, {"-workers", "0"}, {"-chunk", "1"}, {"-rounds", "0"}, {"extra"}} {
		_, err := parseFlags(bad)
		assert.Error(t, err, "%v", bad)
	}
}

func TestWarmMedian(t *testing.T) {
	assert.Equal(t, 5.0, warmMedian([]float64{0.2, 4, 5, 9}), "the first (cold) round is left out")
	assert.Equal(t, 4.5, warmMedian([]float64{0.2, 4, 5}))
	assert.Equal(t, 3.0, warmMedian([]float64{3}), "a single round is its own median")
}

func TestRewriteZeroes(t *testing.T) {
	for _, kind := range []string{"stosb4K", "stosbPage", "clearNT"} {
		b := make([]byte, 3<<20+123)
		for i := range b {
			b[i] = 0xa5
		}
		rewrite(kind, b, 2<<20)
		for i, v := range b {
			if v != 0 {
				t.Fatalf("%s: byte %d is %#x after the rewrite", kind, i, v)
			}
		}
	}
}
