package jobrun_test

import (
	"context"
	"fmt"
	"os"

	"github.com/hpcvmm/hpcvmm/vmm"
	"github.com/hpcvmm/hpcvmm/vmm/jobrun"
)

// A command in a VM from Go, as `hpcvmm run --rootfs IMAGE -- COMMAND`
// runs it: the running kernel, IMAGE's initramfs (built once, cached), the
// exit status COMMAND's. The program is its own guest agent: built static
// (CGO_ENABLED=0), its main calls jobrun.Dispatch first.
func Example() {
	jobrun.Dispatch() // first in main: started as hpcvmm-agent, it is the agent
	res, err := jobrun.Run(context.Background(), jobrun.Request{
		Image: "/images/busybox.tar",
		Argv:  []string{"sh", "-c", "echo hello; exit 3"},
		VM:    vmm.DefaultConfig(), // 1 vCPU, 1 GiB on 1 GiB pages
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Console: os.Stderr,
		RelaySignals: true, // SIGTERM reaches COMMAND, then the power button
	})
	if err != nil { // a *jobrun.Error: its Kind says who is at fault
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Exit(res.ExitCode()) // 125: the VM failed (res.Reason says why)
}
