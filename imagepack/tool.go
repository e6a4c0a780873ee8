package imagepack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hpcvmm/hpcvmm/trustfs"
)

// toolDirs are where mksquashfs is looked for, in order: fixed directories,
// never $PATH. hpcvmm may run as root for a job's user, whose environment
// must not choose the program that runs with root's rights. A variable for
// tests.
var toolDirs = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// toolEnv is mksquashfs's whole environment: nothing of the caller's
// (SOURCE_DATE_EPOCH would change its time stamps, and so its bytes).
var toolEnv = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}

// toolName is the program that writes the SquashFS: squashfs-tools'
// mksquashfs reading a tar on its standard input (-tar), the code sqfstar
// runs. Not sqfstar itself: 4.5.1 (Debian 12's) rejects every compressor
// option that takes a value, -Xcompression-level included
// (github.com/plougher/squashfs-tools issue 191, fixed in 4.6; its author's
// workaround is mksquashfs -tar, which writes the same bytes).
const toolName = "mksquashfs"

// findTool returns the path of mksquashfs, or a one-line error saying how
// to get it. The program must be one only root and hpcvmm's user can
// write (trustfs.Check): it reads every file of the image and writes the
// cache.
func findTool() (string, error) {
	for _, d := range toolDirs {
		p := filepath.Join(d, toolName)
		fi, err := os.Stat(p)
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			continue
		}
		if bad := trustfs.Check(p, fi, false); bad != nil {
			return "", bad.Explain(trustfs.Wording{
				Subject:  "imagepack: " + p,
				Kind:     "program",
				Fix:      "reinstall squashfs-tools",
				ModeRisk: ", who could write every converted image",
			})
		}
		return p, nil
	}
	return "", fmt.Errorf("imagepack: %s not found in %s: install squashfs-tools 4.5 or later (apt-get install squashfs-tools), which converts container images and tar archives to SquashFS", toolName, strings.Join(toolDirs, ", "))
}

// settings are the compression settings of a conversion: the package's
// (chosen), or others the benchmark compares.
type settings struct {
	comp  string // mksquashfs's -comp
	level int    // -Xcompression-level; 0: the compressor's default
	block int    // -b, bytes
}

// chosen are the settings Convert uses.
var chosen = settings{comp: Compressor, level: CompressionLevel, block: BlockSize}

func (s settings) String() string { return fmt.Sprintf("%s-%d-%dK", s.comp, s.level, s.block>>10) }

// toolArgs are mksquashfs's arguments for a tar on its standard input
// written to out: a reproducible image (every time stamp 0, the root
// directory 0755 root's: the tar stream has no entry for it) without
// extended attributes (rootfs carries none), compressed as s says,
// -noappend because out is the empty temporary file the cache created.
func toolArgs(out string, s settings) []string {
	args := []string{
		"-", out, "-tar", "-noappend", "-quiet", "-no-progress", "-exit-on-error",
		"-reproducible", "-mkfs-time", "0", "-all-time", "0",
		"-root-mode", "0755", "-root-uid", "0", "-root-gid", "0",
		"-no-xattrs", "-comp", s.comp, "-b", strconv.Itoa(s.block),
	}
	if s.level > 0 {
		args = append(args, "-Xcompression-level", strconv.Itoa(s.level))
	}
	return args
}

// tail keeps the last bytes written to it: mksquashfs's stderr, whose last
// line explains a failure. Its buffer is fixed: no allocation per write.
type tail struct {
	mu  sync.Mutex
	buf [4096]byte
	n   int
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	if len(p) >= len(t.buf) {
		p = p[len(p)-len(t.buf):]
		t.n = 0
	}
	if t.n+len(p) > len(t.buf) {
		drop := t.n + len(p) - len(t.buf)
		copy(t.buf[:], t.buf[drop:t.n])
		t.n -= drop
	}
	t.n += copy(t.buf[t.n:], p)
	return n, nil
}

// lastLine is the last non-empty line written, "" when none.
func (t *tail) lastLine() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := bytes.Split(bytes.TrimSpace(t.buf[:t.n]), []byte("\n"))
	return strings.TrimSpace(string(lines[len(lines)-1]))
}

// toolError is the one-line error of a mksquashfs run that failed.
func toolError(image string, err error, stderr *tail) error {
	last := stderr.lastLine()
	if last == "" {
		last = "no message"
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		err = errors.New(ee.ProcessState.String())
	}
	return fmt.Errorf("imagepack: image %s: %s failed (%v): %s: check the image (a layer or archive it cannot read) and the cache's file system", image, toolName, err, last)
}

// watchSize polls the size of f, which mksquashfs writes, every interval
// until stop is closed, and calls over (once) when it grows past bound:
// mksquashfs's writes cannot be counted as they happen, so the entry's
// bound (the cache's size bound, its file system's free space) is kept by
// stopping it at most one interval late, within the free space's margin.
func watchSize(f *os.File, bound int64, interval time.Duration, stop <-chan struct{}, over func(size int64)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			fi, err := f.Stat()
			if err == nil && fi.Size() > bound {
				over(fi.Size())
				return
			}
		}
	}
}

// startTool starts mksquashfs writing out, reading the tar from the
// returned pipe. It runs as hpcvmm's own process's user (root for a Slurm
// step acting for a job's user), with toolEnv, in its own process group;
// it reads only its standard input and writes only out, the temporary
// file in the cache directory, given as an absolute path: a directory
// that only hpcvmm's user (or root) can write, so no one can replace the
// name. ctx kills the process group, and closes the pipe so a write
// blocked on it returns.
func startTool(ctx context.Context, tool, out string, s settings, stderr *tail) (*exec.Cmd, *os.File, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("imagepack: conversion stopped: %w", context.Cause(ctx))
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("imagepack: pipe: %w", err)
	}
	cmd := exec.CommandContext(ctx, tool, toolArgs(out, s)...)
	cmd.Env = toolEnv
	cmd.Stdin = pr
	cmd.Stdout = stderr // -quiet: only warnings, kept with the errors
	cmd.Stderr = stderr
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		_ = pw.Close()
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		return nil, nil, fmt.Errorf("imagepack: start %s: %w: reinstall squashfs-tools", tool, err)
	}
	pr.Close()
	return cmd, pw, nil
}
