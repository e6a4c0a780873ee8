// Command kvmusable exits 0 when /dev/kvm is usable here (it opens and
// answers KVM_GET_API_VERSION), and 1 with the reason otherwise. .ci/run
// uses it to decide whether to run the integration suite on the host too,
// with exactly the check harness.Run uses in auto mode.
package main

import (
	"fmt"
	"os"

	"github.com/hpcvmm/hpcvmm/tests/harness"
)

func main() {
	if err := harness.KVMUsable(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("/dev/kvm is usable")
}
