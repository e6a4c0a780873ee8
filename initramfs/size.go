package initramfs

// What an initramfs takes of guest memory, and whether a guest can boot it.

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strings"

	"github.com/hpcvmm/hpcvmm/kmodules"
	"github.com/hpcvmm/hpcvmm/rootfs"
)

// Headroom is the guest memory Fits keeps for the kernel and the agent
// besides the initramfs.
const Headroom = 128 << 20

// Fits checks that an initramfs of archive bytes, unpacking to unpacked
// bytes of tmpfs, fits a guest of guestMemory bytes. While the kernel
// unpacks it, the archive (loaded by hpcvmm into guest RAM) and its
// unpacked copy both live in guest RAM; the kernel frees the archive only
// afterwards. And the initramfs's root is a tmpfs whose default size limit
// is half of the RAM the kernel counts. So both must hold:
//
//	archive + unpacked + Headroom <= guestMemory
//	unpacked <= (guestMemory - Headroom) / 2
//
// Headroom covers the kernel's own use (its image, page tables, memmap).
// COMMAND's own memory comes on top; this only refuses what cannot boot.
func Fits(archive, unpacked, guestMemory int64) error {
	need := max(archive+unpacked+Headroom, 2*unpacked+Headroom)
	if need <= guestMemory {
		return nil
	}
	return fmt.Errorf("needs at least %d MiB of guest memory (a %d MiB archive and its %d MiB unpacked copy both live in guest RAM while the kernel unpacks it, the unpacked tree may take at most half of it, plus %d MiB for the kernel), the guest has %d MiB: raise --memory or use a smaller image",
		mib(need), mib(archive), mib(unpacked), mib(Headroom), mib(guestMemory))
}

func mib(n int64) int64 { return (n + 1<<20 - 1) >> 20 }

// Extra returns what Build adds to IMAGE's tree for cfg, in archive
// bytes and unpacked bytes (rootfs.Usage's rules): the directories it
// makes, the agent, the modules with their list and their firmware. With an IMAGE's
// rootfs.Usage it gives the sizes Fits judges before anything is built,
// so the first refusal names the guest memory the build will accept (it
// counts every directory, the image's own included: an upper bound by a
// few KiB). It resolves the modules as Build does (their files read and
// decompressed) and writes nothing.
func Extra(cfg Config) (archive, unpacked int64, err error) {
	if cfg.Image == nil || cfg.Agent == "" || cfg.Release == "" {
		return 0, 0, errors.New("initramfs: Extra needs Config.Image, Agent and Release")
	}
	add := func(name string, size int64) {
		archive += rootfs.NewcSize(name, size)
		unpacked += rootfs.EntryOverhead + (size+rootfs.PageSize-1)/rootfs.PageSize*rootfs.PageSize
	}
	for _, d := range []string{"proc", "sys", "dev", "tmp", "run", "dev/console", ".hpcvmm"} {
		add(d, 0)
	}
	fi, err := os.Stat(cfg.Agent)
	if err != nil {
		return 0, 0, fmt.Errorf("initramfs: agent: %w", err)
	}
	add(strings.TrimPrefix(AgentPath, "/"), fi.Size())
	set, err := kmodules.Resolve(cfg.modules(cfg.Image))
	if err != nil {
		return 0, 0, err
	}
	base := "usr/lib/modules/" + set.Release // lib/modules, or below /lib's target (merged /usr)
	dirs := map[string]bool{}
	list := 0
	for _, m := range set.Modules {
		name := base + "/" + m.Path
		for d := path.Dir(name); d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
			add(d, 0)
		}
		add(name, int64(len(m.Data)))
		list += len(name) + 2
	}
	add(strings.TrimPrefix(ModulesList, "/"), int64(list))
	fw, err := kmodules.FindFirmware(cfg.firmwareDirs(), set.Firmware(), cfg.RequireFirmware)
	if err != nil {
		return 0, 0, fmt.Errorf("initramfs: %w", err)
	}
	for _, f := range fw.Found {
		name := "usr/lib/firmware/" + f.Path
		for d := path.Dir(name); d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
			add(d, 0)
		}
		add(name, f.Size)
	}
	return archive + 512, unpacked, nil // 512: the slack Build's own check keeps
}
