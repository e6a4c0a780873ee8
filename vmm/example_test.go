package vmm_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"

	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/vmm"
)

// Boot a distribution kernel with 2 vCPUs and 1 GiB of RAM on 2 MiB
// hugepages, its console on the UART, until the guest powers off or
// Ctrl-C. New validates the Config, checks the host (the checks of `hpcvmm
// check`), reserves and prefaults guest RAM and builds the VM; Close
// releases everything, whatever happened.
func Example() {
	cfg := vmm.DefaultConfig()
	cfg.Kernel = "/boot/vmlinuz-6.1.0-56-amd64"
	cfg.Initrd = "/boot/initrd.img-6.1.0-56-amd64"
	cfg.Cmdline = "console=ttyS0 reboot=k panic=-1"
	cfg.Console = vmm.ConsoleSerial
	cfg.Stdin = os.Stdin
	cfg.CPUs, cfg.Memory, cfg.HugePages = 2, 1<<30, guestmem.Page2M

	vm, err := vmm.New(cfg)
	var fe *vmm.FieldError
	var pe *vmm.PreflightError
	switch {
	case errors.As(err, &fe):
		log.Fatalf("Config.%s: %v", fe.Field, fe.Err) // bad input
	case errors.As(err, &pe):
		log.Fatal(pe) // the host cannot run it: each failed check with its fix
	case err != nil:
		log.Fatal(err)
	}
	defer vm.Close()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := vm.Run(ctx); err != nil { // nil: the guest rebooted or powered off
		log.Fatal(err)
	}
}

// Validation errors name the Config field at fault (a *vmm.FieldError),
// never a command-line flag: the CLI maps fields to its flags.
func ExampleFieldError() {
	cfg := vmm.DefaultConfig() // no Kernel yet
	cfg.Memory = 1536 << 20    // not a multiple of the default 1 GiB pages
	err := cfg.Validate()
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var fe *vmm.FieldError
		if errors.As(e, &fe) {
			fmt.Printf("%s: %v\n", fe.Field, fe.Err)
		}
	}
	// Output:
	// Kernel: no kernel given: give a bzImage such as /boot/vmlinuz-$(uname -r), or a vmlinux
	// Memory: 1536M is not a multiple of the 1G page size: use 2G, or a smaller page size
}
