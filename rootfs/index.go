package rootfs

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strconv"
	"strings"
)

// The index of an archive or container image is its tree's metadata
// (names, types, modes, owners, sizes, link targets) and its executables'
// ELF interpreters: what LookPath, Interp, ReadFiles' name resolution and
// Usage need. Building it means reading the
// whole image, so package initramfs stores it beside the archive it built
// (SaveIndex) and hands it back on a cache hit (LoadIndex): a warm launch
// then checks COMMAND without reading the image. A directory IMAGE needs
// none (lookups Lstat the host directory).

// indexMagic heads an index; v3 added the interpreters ("interp" lines).
// A v2 index (an older hpcvmm's cache) still loads, its interpreters
// unknown: Interp says "" and the guest reports a missing one.
const (
	indexMagic   = "hpcvmm-rootfs-index v3"
	indexMagicV2 = "hpcvmm-rootfs-index v2"
)

// SaveIndex writes the image's index to w (walking the image first if no
// complete walk has yet). A directory IMAGE writes only the header.
func (im *Image) SaveIndex(w io.Writer) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "%s\n", indexMagic)
	if im.format != FormatDir {
		if err := im.buildIndex(); err != nil {
			return err
		}
		// Sorted so parents come before children and the bytes are
		// reproducible.
		names := make([]string, 0, len(im.idx))
		for n := range im.idx {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			e := im.idx[n]
			hl := 0
			if e.Hardlink {
				hl = 1
			}
			fmt.Fprintf(bw, "%s %d %d %d %d %d %d %d %s\n", strconv.Quote(e.Name), uint32(e.Mode), e.Size, e.UID, e.GID, hl, e.DevMajor, e.DevMinor, strconv.Quote(e.Link))
		}
		interps := make([]string, 0, len(im.interp))
		for n := range im.interp {
			interps = append(interps, n)
		}
		slices.Sort(interps)
		for _, n := range interps {
			fmt.Fprintf(bw, "interp %s %s\n", strconv.Quote(n), strconv.Quote(im.interp[n]))
		}
		fmt.Fprintf(bw, "usage %d %d %d %d\n", im.usage.Entries, im.usage.Bytes, im.usage.Memory, im.usage.Archive)
	}
	return bw.Flush()
}

// LoadIndex adopts an index SaveIndex wrote for this same image (the
// caller vouches for that: initramfs keys it by the image's Key). It is
// ignored for a directory IMAGE.
func (im *Image) LoadIndex(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	if !sc.Scan() || (sc.Text() != indexMagic && sc.Text() != indexMagicV2) {
		return errors.New("rootfs: not an index (no " + indexMagic + " header)")
	}
	if im.format == FormatDir {
		return nil
	}
	ix := map[string]*Entry{}
	interp := map[string]string{}
	var u Usage
	var done bool
	for line := 2; sc.Scan(); line++ {
		l := sc.Text()
		if rest, ok := strings.CutPrefix(l, "interp "); ok {
			name, target, err := parseInterpLine(rest)
			if err != nil {
				return fmt.Errorf("rootfs: index line %d: %w", line, err)
			}
			interp[name] = target
			continue
		}
		if strings.HasPrefix(l, "usage ") {
			if _, err := fmt.Sscanf(l, "usage %d %d %d %d", &u.Entries, &u.Bytes, &u.Memory, &u.Archive); err != nil {
				return fmt.Errorf("rootfs: index line %d: %w", line, err)
			}
			done = true
			continue
		}
		e, err := parseIndexLine(l)
		if err != nil {
			return fmt.Errorf("rootfs: index line %d: %w", line, err)
		}
		ix[e.Name] = e
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("rootfs: index: %w", err)
	}
	if !done {
		return errors.New("rootfs: index is truncated (no usage line)")
	}
	im.idx, im.interp, im.usage, im.idxErr = ix, interp, u, nil
	return nil
}

// parseInterpLine parses an index's `interp "NAME" "INTERPRETER"` line
// (after "interp "): a clean name and an interpreter without a NUL, as
// elfInterp gives them.
func parseInterpLine(l string) (name, target string, err error) {
	q, err := strconv.QuotedPrefix(l)
	if err != nil {
		return "", "", err
	}
	name, _ = strconv.Unquote(q)
	if target, err = strconv.Unquote(strings.TrimPrefix(l[len(q):], " ")); err != nil {
		return "", "", err
	}
	if c, err := cleanName(name); err != nil || c != name || name == "" {
		return "", "", fmt.Errorf("entry name %q is not clean and inside the root", name)
	}
	if target == "" || strings.IndexByte(target, 0) >= 0 || len(target) >= pathMax {
		return "", "", fmt.Errorf("interpreter %q of %q is not a path", target, name)
	}
	return name, target, nil
}

func parseIndexLine(l string) (*Entry, error) {
	q, err := strconv.QuotedPrefix(l)
	if err != nil {
		return nil, err
	}
	name, _ := strconv.Unquote(q)
	rest := strings.TrimPrefix(l[len(q):], " ")
	var mode uint32
	var hl int
	e := &Entry{}
	n, err := fmt.Sscanf(rest, "%d %d %d %d %d %d %d", &mode, &e.Size, &e.UID, &e.GID, &hl, &e.DevMajor, &e.DevMinor)
	if err != nil || n != 7 {
		return nil, fmt.Errorf("bad fields %q", rest)
	}
	i := strings.LastIndex(rest, " \"")
	if i < 0 {
		return nil, errors.New("no link field")
	}
	link, err := strconv.Unquote(rest[i+1:])
	if err != nil {
		return nil, err
	}
	if c, err := cleanName(name); err != nil || c != name || name == "" {
		return nil, fmt.Errorf("entry name %q is not clean and inside the root", name)
	}
	e.Name, e.Mode, e.Hardlink, e.Link = name, fs.FileMode(mode), hl == 1, link
	return e, nil
}
