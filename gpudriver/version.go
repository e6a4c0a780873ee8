package gpudriver

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"strings"
)

// IsDriverVersion reports whether s looks like an NVIDIA driver version as
// the driver suffixes its libraries with it (580.159.04, 535.104.05,
// 470.82.01, 96.43.23): two or three dot-separated decimal numbers, the
// first of at least two digits. Other libraries' version suffixes (glvnd's
// libEGL.so.1.1.0, ocl-icd's libOpenCL.so.1.0.0, libnvidia-nvvm.so.4's
// soname) do not look like one.
func IsDriverVersion(s string) bool {
	parts := strings.Split(s, ".")
	if len(parts) < 2 || len(parts) > 3 || len(parts[0]) < 2 {
		return false
	}
	for _, p := range parts {
		if p == "" || len(p) > 6 || strings.Trim(p, "0123456789") != "" {
			return false
		}
	}
	return true
}

// ParseVersion returns the driver version in the text of
// /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX Open Kernel
// Module for x86_64  580.159.04  Release Build ...", or the proprietary
// module's "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05 ...")
// or of /sys/module/nvidia/version ("580.159.04").
func ParseVersion(b []byte) (string, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, "NVRM version:")
		if !ok {
			rest = line // /sys/module/nvidia/version: the version alone
		}
		for _, f := range strings.Fields(rest) {
			if IsDriverVersion(f) {
				return f, nil
			}
		}
		if ok {
			break
		}
	}
	return "", fmt.Errorf("no driver version in %.100q", b)
}

// ModuleVersion is the version of the NVIDIA kernel module loaded on the
// host whose root directory is root ("/" on a host, a tree in tests): from
// /proc/driver/nvidia/version, else /sys/module/nvidia/version.
func ModuleVersion(root string) (string, error) {
	var firstErr error
	for _, p := range []string{"/proc/driver/nvidia/version", "/sys/module/nvidia/version"} {
		b, err := readBounded(root, p, 4096)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err == nil {
			var v string
			if v, err = ParseVersion(b); err == nil {
				return v, nil
			}
		}
		if firstErr == nil {
			firstErr = fmt.Errorf("gpudriver: %s: %w", p, err)
		}
	}
	if firstErr != nil {
		return "", firstErr
	}
	return "", fmt.Errorf("gpudriver: %w (no /proc/driver/nvidia/version nor /sys/module/nvidia/version): load it (modprobe nvidia) or run without the GPU's driver libraries", ErrNotLoaded)
}

// ErrNotLoaded is ModuleVersion's (and Find's) error when the host has no
// NVIDIA kernel module loaded, so no version to match libraries against.
var ErrNotLoaded = errors.New("the NVIDIA kernel module is not loaded")
