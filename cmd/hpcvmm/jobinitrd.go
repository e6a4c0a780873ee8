package main

import (
	"errors"
	"log/slog"

	"github.com/hpcvmm/hpcvmm/rootfs"
)

// buildJobInitrd builds (or finds in the cache) IMAGE's initramfs with the
// agent and the guest's modules.
func buildJobInitrd(im *rootfs.Image, f *runFlags, log *slog.Logger) (string, error) {
	return "", errors.New("building an initramfs from --rootfs awaits package initramfs")
}
