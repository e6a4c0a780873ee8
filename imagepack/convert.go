package imagepack

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/hpcvmm/hpcvmm/filecache"
	"github.com/hpcvmm/hpcvmm/imagefile"
	"github.com/hpcvmm/hpcvmm/rootfs"
)

// watchInterval is how often a conversion checks the size of the file
// mksquashfs writes against the entry's bound. A variable for tests.
var watchInterval = 100 * time.Millisecond

// stats is what a conversion reports.
type stats struct {
	in      int64 // tar bytes streamed to mksquashfs
	size    int64 // the SquashFS's size
	sockets int
	image   imagefile.Image
}

// convert writes im's SquashFS into the cache under key. A plain tar that
// lists a name twice is converted in a second pass that keeps the last
// entry of each name (see packer).
func convert(ctx context.Context, im *rootfs.Image, c *Cache, key, tool string, s settings) (*stats, error) {
	p := pass{tool: tool, s: s, dedupe: im.Format() == rootfs.FormatTar}
	st, err := p.convert(ctx, im, c, key)
	if !errors.Is(err, errDuplicate) {
		return st, err
	}
	if p.skip, err = countDuplicates(im); err != nil {
		return nil, err
	}
	return p.convert(ctx, im, c, key)
}

// pass is how one pass over the image runs.
type pass struct {
	tool   string
	s      settings
	dedupe bool           // the image may list a name twice (packer.seen)
	skip   map[string]int // the second pass's (packer.skip)
}

// convert is one pass: mksquashfs started on a temporary file of the
// cache, the image walked (checked against its key) into its standard
// input as a tar, the result synced, hashed, checked by imagefile.Detect
// and put into the cache with the image's index. Any failure removes the
// temporary file.
func (p pass) convert(ctx context.Context, im *rootfs.Image, c *Cache, key string) (st *stats, err error) {
	f, err := c.CreateTemp(key)
	if err != nil {
		return nil, err
	}
	tmp := f.Name()
	defer func() {
		_ = f.Close()
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	st, err = p.run(ctx, im, c, f)
	if err != nil {
		return nil, err
	}
	if err := f.Sync(); err != nil {
		return nil, fmt.Errorf("imagepack: cache: sync %s: %w", tmp, err)
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("imagepack: cache: %w", err)
	}
	st.size = fi.Size()
	if st.image, err = imagefile.Detect(tmp, f, st.size); err != nil {
		return nil, fmt.Errorf("imagepack: image %s: %s wrote no valid SquashFS (%w): check squashfs-tools", im.Path(), toolName, err)
	}
	sum, err := hashFile(f, st.size)
	if err != nil {
		return nil, fmt.Errorf("imagepack: cache: read %s: %w", tmp, err)
	}
	m := &meta{sum: sum, size: st.size}
	var files []filecache.File
	if im.Format() != rootfs.FormatDir {
		var ib bytes.Buffer
		if err := im.SaveIndex(&ib); err != nil {
			return nil, err
		}
		isum := sha256.Sum256(ib.Bytes())
		m.index = hex.EncodeToString(isum[:])
		files = append(files, filecache.File{Ext: indexExt, Content: ib.Bytes()})
	}
	files = append(files, filecache.File{Ext: metaExt, Content: m.encode()})
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("imagepack: cache: close %s: %w", tmp, err)
	}
	if err := c.Put(key, tmp, files...); err != nil {
		return nil, err
	}
	return st, nil
}

// run streams im into mksquashfs writing f and waits for it. Its errors, in
// order of precedence: ctx's, the entry's bound, mksquashfs's own (with its
// last line; a write to its pipe then failed as a consequence), the walk's.
func (p pass) run(ctx context.Context, im *rootfs.Image, c *Cache, f *os.File) (*stats, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stderr := &tail{}
	cmd, pw, err := startTool(ctx, p.tool, f.Name(), p.s, stderr)
	if err != nil {
		return nil, err
	}
	bound, why := c.EntryBound()
	var (
		overMu sync.Mutex
		over   error
	)
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		watchSize(f, bound, watchInterval, stop, func(size int64) {
			overMu.Lock()
			over = fmt.Errorf("imagepack: image %s: its SquashFS grows past %d MiB (%d MiB written), %s: use a smaller image, or make room for the cache", im.Path(), mib(bound), mib(size), why)
			overMu.Unlock()
			cancel()
		})
	}()

	bw := bufio.NewWriterSize(pipeWriter{pw}, 1<<20)
	in := &sink{w: bw, limit: c.Max(), over: &boundError{image: im.Path(), bound: c.Max(), why: "the size bound of the cache " + c.Dir()}}
	pk := newPacker(in, im.Path(), p.dedupe, p.skip)
	walkErr := im.WalkKeyed(pk.entry)
	if walkErr == nil {
		walkErr = pk.close()
	}
	if walkErr == nil {
		if err := bw.Flush(); err != nil {
			walkErr = writeError{err}
		}
	}
	if walkErr != nil && !errors.As(walkErr, new(writeError)) {
		cancel() // the walk failed on its own: mksquashfs must not finish a partial image
	}
	_ = pw.Close()
	waitErr := cmd.Wait()
	close(stop)
	<-watched

	overMu.Lock()
	defer overMu.Unlock()
	switch {
	case over != nil:
		return nil, over
	case ctx.Err() != nil && (walkErr == nil || errors.As(walkErr, new(writeError))):
		return nil, fmt.Errorf("imagepack: image %s: conversion stopped: %w", im.Path(), context.Cause(ctx))
	case walkErr != nil && !errors.As(walkErr, new(writeError)):
		return nil, walkErr
	case waitErr != nil:
		return nil, toolError(im.Path(), waitErr, stderr)
	case walkErr != nil:
		return nil, walkErr // mksquashfs exited 0 without reading everything
	}
	return &stats{in: in.n, sockets: pk.sockets}, nil
}

// pipeWriter marks the pipe's errors as writeErrors (mksquashfs exited or
// was stopped).
type pipeWriter struct{ f *os.File }

func (w pipeWriter) Write(b []byte) (int, error) {
	n, err := w.f.Write(b)
	if err != nil {
		return n, writeError{err}
	}
	return n, nil
}
