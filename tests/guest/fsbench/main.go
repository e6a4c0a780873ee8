// Command fsbench is the guest side of the bench's 9P binds case
// (tests/bench, -cases binds; issue 37): on one directory it times a
// sequential read of a file (1 MiB reads), a sequential write (1 MiB
// writes, then fsync and close) and the creation and stat of many small
// files, and prints one machine-readable line per measurement:
//
//	fsbench mount fstype=9p source=hpcvmm options=rw,...,msize=524288,...
//	fsbench read bytes=268435456 ns=... mib_s=...
//	fsbench write bytes=67108864 ns=... mib_s=...
//	fsbench create files=1000 bytes=4096 ns=...
//	fsbench stat files=1000 ns=...
//	fsbench meta files=1000 ns=...
//	fsbench done
//
// The same program runs natively in L1, in hpcvmm's guest on a -B bind
// and in QEMU's guest on a virtio-9p mount of the same directory, so the
// three differ only in the file system under it. It is built static
// (CGO_ENABLED=0) by the bench, so it runs from a busybox initramfs.
//
// The file it reads is made beforehand, unmeasured, by `fsbench -prepare
// DIR` (natively, where the directory is): the first 8 bytes of each MiB
// are the MiB's index, which the timed read checks, so a short or
// misplaced read is an error rather than a fast number. The write and the
// small files are removed afterwards, unmeasured.
//
// Usage: fsbench [-prepare] [-read-mib N] [-write-mib N] [-files N] DIR
package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// chunk is the size of every read and write (the 1 MiB).
const chunk = 1 << 20

// smallFile is the size of each of the small files.
const smallFile = 4 << 10

// readName is the prepared file the read measurement reads.
const readName = "fsbench-read.dat"

// params are one run's sizes.
type params struct {
	readMiB, writeMiB, files int
}

func main() {
	fs := flag.NewFlagSet("fsbench", flag.ContinueOnError)
	prepare := fs.Bool("prepare", false, "only write DIR/"+readName+" (-read-mib MiB) for later runs")
	var p params
	fs.IntVar(&p.readMiB, "read-mib", 256, "MiB read sequentially")
	fs.IntVar(&p.writeMiB, "write-mib", 64, "MiB written sequentially")
	fs.IntVar(&p.files, "files", 1000, "small files (4 KiB each) created and stat-ed")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if fs.NArg() != 1 {
		fmt.Println("fsbench error=" + strconv.Quote("usage: fsbench [-prepare] [-read-mib N] [-write-mib N] [-files N] DIR"))
		os.Exit(2)
	}
	var err error
	if *prepare {
		err = prepareRead(fs.Arg(0), p.readMiB, os.Stdout)
	} else {
		err = run(fs.Arg(0), p, "/proc/self/mountinfo", os.Stdout)
	}
	if err != nil {
		fmt.Println("fsbench error=" + strconv.Quote(err.Error()))
		os.Exit(1)
	}
}

// fillChunk makes buf the content of MiB number i of the read file: its
// index, then a pattern that changes with it.
func fillChunk(buf []byte, i int) {
	for j := range buf {
		buf[j] = byte(i*7 + j)
	}
	binary.LittleEndian.PutUint64(buf, uint64(i))
}

// prepareRead writes dir's read file of mib MiB.
func prepareRead(dir string, mib int, w io.Writer) error {
	if mib < 1 {
		return fmt.Errorf("-read-mib %d: want at least 1", mib)
	}
	path := filepath.Join(dir, readName)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	buf := make([]byte, chunk)
	for i := range mib {
		fillChunk(buf, i)
		if _, err := f.Write(buf); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Fprintf(w, "fsbench prepared bytes=%d\n", int64(mib)*chunk)
	return nil
}

// run measures on dir and writes the result lines to w; mountinfo is
// where the mount's options are read (/proc/self/mountinfo).
func run(dir string, p params, mountinfo string, w io.Writer) error {
	if p.readMiB < 1 || p.writeMiB < 1 || p.files < 1 {
		return fmt.Errorf("sizes %+v: want at least 1 of each", p)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if m, err := mountOf(mountinfo, abs); err == nil {
		fmt.Fprintf(w, "fsbench mount fstype=%s source=%s options=%s\n", m.fstype, m.source, m.options)
	} else {
		fmt.Fprintf(w, "fsbench mount fstype=unknown source=unknown options=%s\n", strconv.Quote(err.Error()))
	}
	buf := make([]byte, chunk)
	n, took, err := timeRead(filepath.Join(abs, readName), p.readMiB, buf)
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	fmt.Fprintf(w, "fsbench read bytes=%d ns=%d mib_s=%.2f\n", n, took.Nanoseconds(), mibPerSec(n, took))
	n, took, err = timeWrite(filepath.Join(abs, fmt.Sprintf("fsbench-write.%d", os.Getpid())), p.writeMiB, buf)
	if err != nil {
		return fmt.Errorf("write: %w", err)
	}
	fmt.Fprintf(w, "fsbench write bytes=%d ns=%d mib_s=%.2f\n", n, took.Nanoseconds(), mibPerSec(n, took))
	create, stat, err := timeSmallFiles(filepath.Join(abs, fmt.Sprintf("fsbench-meta.%d", os.Getpid())), p.files)
	if err != nil {
		return fmt.Errorf("small files: %w", err)
	}
	fmt.Fprintf(w, "fsbench create files=%d bytes=%d ns=%d\n", p.files, smallFile, create.Nanoseconds())
	fmt.Fprintf(w, "fsbench stat files=%d ns=%d\n", p.files, stat.Nanoseconds())
	fmt.Fprintf(w, "fsbench meta files=%d ns=%d\n", p.files, (create + stat).Nanoseconds())
	fmt.Fprintln(w, "fsbench done")
	return nil
}

func mibPerSec(n int64, d time.Duration) float64 {
	return float64(n) / (1 << 20) / d.Seconds()
}

// timeRead reads path in 1 MiB reads to its end, from open to close, and
// checks that it holds mib MiB whose index words are in order.
func timeRead(path string, mib int, buf []byte) (int64, time.Duration, error) {
	start := time.Now()
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, fmt.Errorf("%w (made by fsbench -prepare)", err)
	}
	var n int64
	for i := 0; ; i++ {
		k, err := io.ReadFull(f, buf)
		n += int64(k)
		if err == io.EOF {
			break
		}
		if err != nil {
			f.Close()
			return n, 0, fmt.Errorf("%s at %d: %w", path, n, err)
		}
		if got := binary.LittleEndian.Uint64(buf); got != uint64(i) {
			f.Close()
			return n, 0, fmt.Errorf("%s: MiB %d holds MiB %d's index: not the prepared file", path, i, got)
		}
	}
	if err := f.Close(); err != nil {
		return n, 0, err
	}
	took := time.Since(start)
	if n != int64(mib)*chunk {
		return n, 0, fmt.Errorf("%s: %d bytes, want %d (-read-mib %d)", path, n, int64(mib)*chunk, mib)
	}
	return n, took, nil
}

// timeWrite writes mib MiB to a new file at path in 1 MiB writes, syncs
// and closes it (all timed), checks its size and removes it.
func timeWrite(path string, mib int, buf []byte) (int64, time.Duration, error) {
	for j := range buf {
		buf[j] = byte(j * 13)
	}
	start := time.Now()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return 0, 0, err
	}
	defer os.Remove(path)
	var n int64
	for range mib {
		k, err := f.Write(buf)
		n += int64(k)
		if err != nil {
			f.Close()
			return n, 0, err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return n, 0, fmt.Errorf("fsync: %w", err)
	}
	if err := f.Close(); err != nil {
		return n, 0, err
	}
	took := time.Since(start)
	fi, err := os.Stat(path)
	if err != nil {
		return n, 0, err
	}
	if fi.Size() != n {
		return n, 0, fmt.Errorf("%s: %d bytes after the write, want %d", path, fi.Size(), n)
	}
	return n, took, nil
}

// timeSmallFiles creates n files of 4 KiB in a new directory dir (each
// created, written and closed), then stats each and checks its size; it
// returns both times and removes dir.
func timeSmallFiles(dir string, n int) (create, stat time.Duration, err error) {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(dir)
	data := make([]byte, smallFile)
	for j := range data {
		data[j] = byte(j)
	}
	names := make([]string, n)
	for i := range names {
		names[i] = filepath.Join(dir, "f"+strconv.Itoa(i))
	}
	start := time.Now()
	for _, name := range names {
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return 0, 0, err
		}
		if _, err := f.Write(data); err != nil {
			f.Close()
			return 0, 0, err
		}
		if err := f.Close(); err != nil {
			return 0, 0, err
		}
	}
	create = time.Since(start)
	start = time.Now()
	for _, name := range names {
		fi, err := os.Stat(name)
		if err != nil {
			return 0, 0, err
		}
		if fi.Size() != smallFile {
			return 0, 0, fmt.Errorf("%s: %d bytes, want %d", name, fi.Size(), smallFile)
		}
	}
	return create, time.Since(start), nil
}

// mount is one /proc/self/mountinfo entry.
type mount struct {
	point, fstype, source, options string
}

// mountOf finds the mount that holds path (the entry with the longest
// mount point at or above it; the last such when mounts are stacked) and
// its options: the mount's own and the file system's, which carry 9P's
// msize and cache mode.
func mountOf(mountinfo, path string) (mount, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return mount{}, err
	}
	defer f.Close()
	var best mount
	found := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m, ok := parseMountinfo(sc.Text())
		if !ok || !under(path, m.point) {
			continue
		}
		if !found || len(m.point) >= len(best.point) {
			best, found = m, true
		}
	}
	if err := sc.Err(); err != nil {
		return mount{}, err
	}
	if !found {
		return mount{}, errors.New("no mount holds " + path)
	}
	return best, nil
}

// under reports whether path is point or lies beneath it.
func under(path, point string) bool {
	return point == "/" || path == point || strings.HasPrefix(path, point+"/")
}

// parseMountinfo reads one mountinfo line (proc(5)): ID PARENT MAJ:MIN
// ROOT POINT MOUNT-OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER-OPTIONS.
func parseMountinfo(line string) (mount, bool) {
	before, after, ok := strings.Cut(line, " - ")
	if !ok {
		return mount{}, false
	}
	f, g := strings.Fields(before), strings.Fields(after)
	if len(f) < 6 || len(g) < 3 {
		return mount{}, false
	}
	return mount{point: unescapeOctal(f[4]), fstype: g[0], source: g[1], options: f[5] + "," + g[2]}, true
}

// unescapeOctal undoes mountinfo's \ooo escapes (space, tab, newline,
// backslash).
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
