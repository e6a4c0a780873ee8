package platform

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
)

// maxLoggedAddrs bounds the set of addresses remembered as already logged.
// A guest can probe the whole MMIO space; without a bound that would be a
// guest-driven memory leak in the VMM.
const maxLoggedAddrs = 4096

// Unhandled is the sink for accesses no device claims. Reads see all ones,
// what a PC returns for a port or address nobody decodes (drivers probing
// for absent hardware expect exactly that); writes are dropped. Each
// distinct address is logged once at debug level, so a guest polling a
// missing device cannot flood the log.
type Unhandled struct {
	log  *slog.Logger
	kind string

	mu sync.Mutex
	// +checklocks:mu
	seen map[uint64]struct{}
	// +checklocks:mu
	full bool // maxLoggedAddrs reached and reported
}

// NewUnhandled returns a sink whose log lines carry kind ("pio" or "mmio").
// A nil log discards.
func NewUnhandled(log *slog.Logger, kind string) *Unhandled {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Unhandled{log: log, kind: kind, seen: make(map[uint64]struct{})}
}

// Access handles one unclaimed access of len(data) bytes at addr: a read
// fills data with 0xff, a write is ignored. It is safe for concurrent use
// and allocates only the first time an address is seen.
func (u *Unhandled) Access(addr uint64, data []byte, write bool) {
	if !write {
		fill(data, 0xff)
	}
	// Skip the bookkeeping entirely when nobody would see the line.
	if !u.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	u.mu.Lock()
	if _, ok := u.seen[addr]; ok {
		u.mu.Unlock()
		return
	}
	if len(u.seen) >= maxLoggedAddrs {
		first := !u.full
		u.full = true
		u.mu.Unlock()
		if first {
			u.log.Debug("unhandled guest access: too many distinct addresses, no longer logging new ones",
				"kind", u.kind, "limit", maxLoggedAddrs)
		}
		return
	}
	u.seen[addr] = struct{}{}
	u.mu.Unlock()

	if write {
		u.log.Debug("unhandled guest access", "kind", u.kind, "op", "write", "addr", hex(addr), "size", len(data), "value", hex(littleEndian(data)))
	} else {
		u.log.Debug("unhandled guest access", "kind", u.kind, "op", "read", "addr", hex(addr), "size", len(data))
	}
}

// hex formats v the way addresses are written in the kernel's and
// hardware manuals.
func hex(v uint64) string { return fmt.Sprintf("%#x", v) }

// littleEndian returns data (at most 8 bytes) as the value the guest
// stored, for the log.
func littleEndian(data []byte) uint64 {
	var v uint64
	for i := len(data) - 1; i >= 0; i-- {
		if i < 8 {
			v = v<<8 | uint64(data[i])
		}
	}
	return v
}
