package main

import (
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"

	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/vmm"
)

// Flag values that convert while parsing, so a bad value is reported by the
// parser with the flag's name, on one line, before any other work. Each
// Type is the placeholder --help shows when the usage text has none.

// sizeValue is a byte count with K/M/G/T suffixes (--memory).
type sizeValue struct{ p *uint64 }

func (v sizeValue) String() string {
	if v.p == nil {
		return ""
	}
	return guestmem.FormatSize(*v.p)
}
func (v sizeValue) Type() string { return "SIZE" }
func (v sizeValue) Set(s string) error {
	n, err := guestmem.ParseSize(s)
	if err != nil {
		return err
	}
	*v.p = n
	return nil
}

// int64SizeValue is a byte count with K/M/G/T suffixes into an int64
// (--kernel-cache-size); zero means the default.
type int64SizeValue struct{ p *int64 }

func (v int64SizeValue) String() string {
	if v.p == nil || *v.p <= 0 {
		return ""
	}
	return guestmem.FormatSize(uint64(*v.p))
}
func (v int64SizeValue) Type() string { return "SIZE" }
func (v int64SizeValue) Set(s string) error {
	n, err := guestmem.ParseSize(s)
	if err != nil {
		return err
	}
	if n == 0 || n > math.MaxInt64 {
		return fmt.Errorf("want a size above zero, e.g. 2G")
	}
	*v.p = int64(n)
	return nil
}

// decompressValue is host or guest (--kernel-decompress).
type decompressValue struct{ p *vmm.KernelDecompress }

func (v decompressValue) String() string {
	if v.p == nil || *v.p == "" {
		return string(vmm.DecompressHost)
	}
	return string(*v.p)
}
func (v decompressValue) Type() string { return "host|guest" }
func (v decompressValue) Set(s string) error {
	switch d := vmm.KernelDecompress(s); d {
	case vmm.DecompressHost, vmm.DecompressGuest:
		*v.p = d
		return nil
	}
	return fmt.Errorf("want host or guest")
}

// pageSizeValue is 1G, 2M or none (--hugepages).
type pageSizeValue struct{ p *guestmem.PageSize }

func (v pageSizeValue) String() string {
	if v.p == nil {
		return ""
	}
	if *v.p == guestmem.Page4K {
		return "none"
	}
	return v.p.String()
}
func (v pageSizeValue) Type() string { return "PAGE" }
func (v pageSizeValue) Set(s string) error {
	p, err := guestmem.ParsePageSize(s)
	if err != nil {
		return fmt.Errorf("want 1G, 2M or none (4 KiB pages)")
	}
	*v.p = p
	return nil
}

// nodeValue is a NUMA node number or auto (vmm.NUMANodeAuto).
type nodeValue struct{ p *int }

func (v nodeValue) String() string {
	if v.p == nil || *v.p == vmm.NUMANodeAuto {
		return "auto"
	}
	return strconv.Itoa(*v.p)
}
func (v nodeValue) Type() string { return "NODE" }
func (v nodeValue) Set(s string) error {
	if s == "auto" {
		*v.p = vmm.NUMANodeAuto
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return fmt.Errorf("want a node number or auto")
	}
	*v.p = n
	return nil
}

// cpuListValue is a host CPU list such as 4-7 or 4,6,8 (--cpu-list).
type cpuListValue struct{ p *[]int }

func (v cpuListValue) String() string {
	if v.p == nil || len(*v.p) == 0 {
		return ""
	}
	return host.FormatCPUList(*v.p)
}
func (v cpuListValue) Type() string { return "LIST" }
func (v cpuListValue) Set(s string) error {
	l, err := host.ParseCPUList(s)
	if err != nil {
		return err
	}
	if len(l) == 0 {
		return fmt.Errorf("empty: list CPUs such as 4-7 or 4,6,8, or leave --cpu-list out")
	}
	*v.p = l
	return nil
}

// consoleValue is virtio, serial or none (--console).
type consoleValue struct{ p *vmm.ConsoleKind }

func (v consoleValue) String() string {
	if v.p == nil {
		return ""
	}
	return string(*v.p)
}
func (v consoleValue) Type() string { return "KIND" }
func (v consoleValue) Set(s string) error {
	switch k := vmm.ConsoleKind(s); k {
	case vmm.ConsoleVirtio, vmm.ConsoleSerial, vmm.ConsoleNone:
		*v.p = k
		return nil
	}
	return fmt.Errorf("want virtio, serial or none")
}

// levelValue is a log/slog level name (--log-level).
type levelValue struct{ p *slog.Level }

func (v levelValue) String() string {
	if v.p == nil {
		return ""
	}
	return strings.ToLower(v.p.String())
}
func (v levelValue) Type() string { return "LEVEL" }
func (v levelValue) Set(s string) error {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return fmt.Errorf("want debug, info, warn or error")
	}
	*v.p = l
	return nil
}

// stringList collects a repeatable flag; a comma-separated value is kept
// whole (a --gpu value carries ",clique=N").
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, " ") }
func (l *stringList) Type() string   { return "VALUE" }
func (l *stringList) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// bdfList collects a repeatable BDF flag; a comma-separated value adds
// several.
type bdfList []string

func (l *bdfList) String() string { return strings.Join(*l, ",") }
func (l *bdfList) Type() string   { return "BDF" }
func (l *bdfList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// notValue is a true/false flag stored inverted: --p2p sets
// PassthroughConfig.NoP2P, whose zero value is the default (P2P on).
type notValue struct{ p *bool }

func (v notValue) String() string {
	if v.p == nil {
		return ""
	}
	return strconv.FormatBool(!*v.p)
}
func (v notValue) Type() string { return "bool" }
func (v notValue) Set(s string) error {
	switch s {
	case "true", "on", "1":
		*v.p = false
	case "false", "off", "0":
		*v.p = true
	default:
		return fmt.Errorf("want true or false")
	}
	return nil
}

// topologyValue is --topology: host or flat.
type topologyValue struct{ p *vmm.TopologyKind }

func (v topologyValue) String() string {
	if v.p == nil || *v.p == "" {
		return string(vmm.TopologyHost)
	}
	return string(*v.p)
}
func (v topologyValue) Type() string { return "KIND" }
func (v topologyValue) Set(s string) error {
	switch k := vmm.TopologyKind(s); k {
	case vmm.TopologyHost, vmm.TopologyFlat:
		*v.p = k
		return nil
	}
	return fmt.Errorf("want host or flat")
}

// cpuModeValue is --cpu-mode: dedicated or shared (default: hpcvmm's
// choice, vmm.CPUModeAuto).
type cpuModeValue struct{ p *vmm.CPUMode }

func (v cpuModeValue) String() string {
	if v.p == nil || *v.p == vmm.CPUModeAuto {
		return "auto"
	}
	return string(*v.p)
}
func (v cpuModeValue) Type() string { return "MODE" }
func (v cpuModeValue) Set(s string) error {
	switch m := vmm.CPUMode(s); m {
	case vmm.CPUModeDedicated, vmm.CPUModeShared:
		*v.p = m
		return nil
	case "auto":
		*v.p = vmm.CPUModeAuto
		return nil
	}
	return fmt.Errorf("want dedicated, shared or auto")
}

// onOffValue is a boolean spelled on/off (--acpi), stored inverted when the
// Config field says what is off.
type onOffValue struct {
	p      *bool
	invert bool
}

func (v onOffValue) String() string {
	if v.p == nil || *v.p == v.invert {
		return "off"
	}
	return "on"
}
func (v onOffValue) Type() string { return "on|off" }
func (v onOffValue) Set(s string) error {
	switch s {
	case "on":
		*v.p = !v.invert
	case "off":
		*v.p = v.invert
	default:
		return fmt.Errorf("want on or off")
	}
	return nil
}

// apicIDsValue is the hidden --apic-ids: a comma list of APIC IDs.
type apicIDsValue struct{ p *[]uint32 }

func (v apicIDsValue) String() string {
	if v.p == nil {
		return ""
	}
	parts := make([]string, len(*v.p))
	for i, id := range *v.p {
		parts[i] = strconv.FormatUint(uint64(id), 10)
	}
	return strings.Join(parts, ",")
}
func (v apicIDsValue) Type() string { return "LIST" }
func (v apicIDsValue) Set(s string) error {
	var ids []uint32
	for _, f := range strings.Split(s, ",") {
		id, err := strconv.ParseUint(strings.TrimSpace(f), 10, 32)
		if err != nil {
			return fmt.Errorf("%q: want APIC IDs such as 0,256", f)
		}
		ids = append(ids, uint32(id))
	}
	*v.p = ids
	return nil
}

// seccompValue is --seccomp: on, off or log.
type seccompValue struct{ p *vmm.SeccompMode }

func (v seccompValue) String() string {
	if v.p == nil || *v.p == "" {
		return string(vmm.SeccompOff)
	}
	return string(*v.p)
}
func (v seccompValue) Type() string { return "on|off|log" }
func (v seccompValue) Set(s string) error {
	switch m := vmm.SeccompMode(s); m {
	case vmm.SeccompOn, vmm.SeccompOff, vmm.SeccompLog:
		*v.p = m
		return nil
	}
	return fmt.Errorf("want on, off or log")
}
