package boot

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOffsetsMatchBootparamH compiles a C program against the kernel's uapi
// asm/bootparam.h and compares every boot_params / setup_header offset this
// package uses with what gcc computes from the real struct definitions.
func TestOffsetsMatchBootparamH(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("no gcc: cannot check offsets against asm/bootparam.h (apt-get install gcc linux-libc-dev)")
	}
	header := ""
	for _, p := range []string{"/usr/include/x86_64-linux-gnu/asm/bootparam.h", "/usr/include/asm/bootparam.h"} {
		if _, err := os.Stat(p); err == nil {
			header = p
			break
		}
	}
	if header == "" {
		t.Skip("no asm/bootparam.h: install linux-libc-dev to check zero-page offsets")
	}

	bp := map[string]int{
		"ext_ramdisk_image":  bpExtRamdiskImage,
		"ext_ramdisk_size":   bpExtRamdiskSize,
		"ext_cmd_line_ptr":   bpExtCmdLinePtr,
		"acpi_rsdp_addr":     bpACPIRSDPAddr,
		"e820_entries":       bpE820Entries,
		"sentinel":           bpSentinel,
		"hdr":                bpHdr,
		"edd_mbr_sig_buffer": bpHdrAreaEnd,
		"e820_table":         bpE820Table,
	}
	hdr := map[string]int{
		"setup_sects":        hdrSetupSects,
		"boot_flag":          hdrBootFlag,
		"jump":               hdrJump,
		"header":             hdrHeader,
		"version":            hdrVersion,
		"kernel_version":     hdrKernelVersion,
		"type_of_loader":     hdrTypeOfLoader,
		"loadflags":          hdrLoadFlags,
		"ramdisk_image":      hdrRamdiskImage,
		"ramdisk_size":       hdrRamdiskSize,
		"cmd_line_ptr":       hdrCmdLinePtr,
		"initrd_addr_max":    hdrInitrdAddrMax,
		"kernel_alignment":   hdrKernelAlignment,
		"relocatable_kernel": hdrRelocatableKernel,
		"xloadflags":         hdrXLoadFlags,
		"cmdline_size":       hdrCmdlineSize,
		"pref_address":       hdrPrefAddress,
		"init_size":          hdrInitSize,
		"handover_offset":    hdrHandoverOffset,
	}
	sizes := map[string]int{
		"sizeof(struct boot_params)":                    zeroPageSize,
		"sizeof(struct boot_e820_entry)":                e820EntrySize,
		"0x1f1 + sizeof(struct setup_header)":           hdrFullEnd,
		"E820_MAX_ENTRIES_ZEROPAGE":                     e820MaxEntriesZeroPage,
		"LOADED_HIGH":                                   loadedHigh,
		"XLF_KERNEL_64":                                 xlfKernel64,
		"XLF_CAN_BE_LOADED_ABOVE_4G":                    xlfCanBeLoadedAbove4G,
		"sizeof(((struct boot_params *)0)->e820_table)": e820MaxEntriesZeroPage * e820EntrySize,
	}

	var src strings.Builder
	src.WriteString("#include <stdio.h>\n#include <stddef.h>\n#include <asm/bootparam.h>\nint main(void) {\n")
	for name := range bp {
		src.WriteString("printf(\"bp." + name + " %zu\\n\", offsetof(struct boot_params, " + name + "));\n")
	}
	for name := range hdr {
		src.WriteString("printf(\"hdr." + name + " %zu\\n\", 0x1f1 + offsetof(struct setup_header, " + name + "));\n")
	}
	for expr := range sizes {
		src.WriteString("printf(\"size.%s %zu\\n\", \"" + expr + "\", (size_t)(" + expr + "));\n")
	}
	src.WriteString("return 0;\n}\n")

	dir := t.TempDir()
	cfile := filepath.Join(dir, "offsets.c")
	bin := filepath.Join(dir, "offsets")
	require.NoError(t, os.WriteFile(cfile, []byte(src.String()), 0o644))
	out, err := exec.Command(gcc, "-o", bin, cfile).CombinedOutput()
	require.NoError(t, err, "gcc: %s", out)
	out, err = exec.Command(bin).Output()
	require.NoError(t, err)

	got := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		i := strings.LastIndexByte(line, ' ')
		require.Positive(t, i, line)
		v, err := strconv.Atoi(line[i+1:])
		require.NoError(t, err, line)
		got[line[:i]] = v
	}
	check := func(prefix string, want map[string]int) {
		for name, v := range want {
			key := prefix + name
			g, ok := got[key]
			if assert.True(t, ok, "gcc printed no %s", key) {
				assert.Equal(t, g, v, "%s: gcc says 0x%x, package uses 0x%x", key, g, v)
			}
		}
	}
	check("bp.", bp)
	check("hdr.", hdr)
	check("size.", sizes)
}
