package preflight

import "github.com/hpcvmm/hpcvmm/guestmem"

// Page sizes a Request may ask for.
const (
	Page4K = uint64(guestmem.Page4K)
	Page2M = uint64(guestmem.Page2M)
	Page1G = uint64(guestmem.Page1G)
)
