package harness

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// Image describes an initramfs: archive paths mapped to host files, literal
// contents or symlinks. Parent directories are created implicitly.
type Image struct {
	entries map[string]imageEntry
}

type imageEntry struct {
	src     string // host file to copy (followed if it is a symlink)
	data    []byte // literal content when src is empty
	link    string // symlink target when non-empty
	perm    os.FileMode
	literal bool
}

// NewImage returns an empty image.
func NewImage() *Image { return &Image{entries: map[string]imageEntry{}} }

// AddFile copies the host file src to dst inside the image with the given
// permissions. A later Add for the same dst replaces the earlier one.
func (im *Image) AddFile(dst, src string, perm os.FileMode) {
	im.entries[clean(dst)] = imageEntry{src: src, perm: perm}
}

// AddBytes stores data at dst.
func (im *Image) AddBytes(dst string, data []byte, perm os.FileMode) {
	im.entries[clean(dst)] = imageEntry{data: data, perm: perm, literal: true}
}

// AddSymlink creates dst as a symlink to target.
func (im *Image) AddSymlink(dst, target string) {
	im.entries[clean(dst)] = imageEntry{link: target}
}

// Has reports whether dst is in the image.
func (im *Image) Has(dst string) bool {
	_, ok := im.entries[clean(dst)]
	return ok
}

func clean(p string) string { return strings.TrimPrefix(path.Clean("/"+p), "/") }

// paths returns every archive path including implicit parent directories,
// sorted so that a directory precedes its contents.
func (im *Image) paths() (files []string, dirs map[string]bool) {
	dirs = map[string]bool{}
	for p := range im.entries {
		files = append(files, p)
		for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	sort.Strings(files)
	return files, dirs
}

// Key is a digest of the image's content description: archive paths, modes,
// literal contents, and each source file's path, size and modification time.
// Equal keys mean an archive built earlier can be reused.
func (im *Image) Key() (string, error) {
	h := sha256.New()
	files, _ := im.paths()
	for _, p := range files {
		e := im.entries[p]
		switch {
		case e.link != "":
			fmt.Fprintf(h, "L %s %s\n", p, e.link)
		case e.literal:
			fmt.Fprintf(h, "B %s %o %d\n", p, e.perm, len(e.data))
			h.Write(e.data)
		default:
			st, err := os.Stat(e.src)
			if err != nil {
				return "", fmt.Errorf("initramfs: stat %s (for %s): %w", e.src, p, err)
			}
			fmt.Fprintf(h, "F %s %o %s %d %d\n", p, e.perm, e.src, st.Size(), st.ModTime().UnixNano())
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// WriteCPIO writes the image as a newc archive.
func (im *Image) WriteCPIO(w io.Writer) error {
	cw := NewCPIOWriter(w)
	files, dirs := im.paths()
	var all []string
	for d := range dirs {
		if _, isEntry := im.entries[d]; !isEntry {
			all = append(all, d)
		}
	}
	all = append(all, files...)
	sort.Strings(all) // "a" < "a/b": parents come first
	for _, p := range all {
		e, ok := im.entries[p]
		var err error
		switch {
		case !ok:
			err = cw.Dir(p, 0o755)
		case e.link != "":
			err = cw.Symlink(p, e.link)
		case e.literal:
			err = cw.File(p, e.perm, int64(len(e.data)), bytes.NewReader(e.data))
		default:
			err = copyInto(cw, p, e)
		}
		if err != nil {
			return err
		}
	}
	return cw.Close()
}

// copyInto writes the host file behind e as p; the cpio writer closes it
// once copied (and the deferred Close covers the error paths before that).
func copyInto(cw *CPIOWriter, p string, e imageEntry) error {
	f, err := os.Open(e.src)
	if err != nil {
		return fmt.Errorf("initramfs: open %s (for %s): %w", e.src, p, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("initramfs: stat %s: %w", e.src, err)
	}
	return cw.File(p, e.perm, st.Size(), f)
}

// Build writes the image to out (gzip-compressed when compress is set) unless
// out already holds an archive built from the same Key. It reports whether
// the archive was (re)written. The write goes through a temporary file so a
// concurrent or interrupted build never leaves a truncated archive behind.
func (im *Image) Build(out string, compress bool) (bool, error) {
	key, err := im.Key()
	if err != nil {
		return false, err
	}
	key = fmt.Sprintf("%s gzip=%v", key, compress)
	stamp := out + ".key"
	if old, err := os.ReadFile(stamp); err == nil && string(old) == key {
		if _, err := os.Stat(out); err == nil {
			return false, nil
		}
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return false, fmt.Errorf("initramfs: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), filepath.Base(out)+".tmp*")
	if err != nil {
		return false, fmt.Errorf("initramfs: %w", err)
	}
	defer os.Remove(tmp.Name())
	var w io.Writer = tmp
	var gz *gzip.Writer
	if compress {
		gz, _ = gzip.NewWriterLevel(tmp, gzip.BestSpeed)
		w = gz
	}
	err = im.WriteCPIO(w)
	if err == nil && gz != nil {
		err = gz.Close()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, fmt.Errorf("initramfs: writing %s: %w", out, err)
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return false, fmt.Errorf("initramfs: %w", err)
	}
	if err := os.WriteFile(stamp, []byte(key), 0o644); err != nil {
		return false, fmt.Errorf("initramfs: %w", err)
	}
	return true, nil
}
