package vmm_test

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hpcvmm/hpcvmm/initramfs"
	"github.com/hpcvmm/hpcvmm/job"
	"github.com/hpcvmm/hpcvmm/rootfs"
	"github.com/hpcvmm/hpcvmm/vmm"
)

// A command in a VM from Go, as `hpcvmm run --rootfs IMAGE -- COMMAND`
// runs it: its files from IMAGE, its streams as io.Reader/io.Writer, its
// exit status from Run. The VM side is generic (named console ports, the
// power button); package job is the command's.
func Example_job() {
	im, err := rootfs.Open("/images/busybox.tar")
	if err != nil {
		fmt.Println(err)
		return
	}
	self, _ := os.Executable() // a static hpcvmm binary: the guest agent
	initrd, err := initramfs.Build(initramfs.Config{Image: im, Agent: self, Release: "6.1.0-56-amd64", GuestMemory: 1 << 30})
	if err != nil {
		fmt.Println(err)
		return
	}

	j, err := job.New(job.Spec{Argv: []string{"sh", "-c", "echo hello; exit 3"}},
		job.Streams{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr},
		job.Options{ShutdownTimeout: 30 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	cfg := vmm.DefaultConfig()
	cfg.Kernel = "/boot/vmlinuz-6.1.0-56-amd64"
	cfg.Initrd = initrd.Path
	cfg.Cmdline = "console=ttyS0 quiet reboot=k panic=-1 rdinit=" + initramfs.AgentPath
	cfg.Stdout = os.Stderr // the kernel's console: never the command's stdout
	cfg.ConsolePorts = j.Ports()
	vm, err := vmm.New(cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer vm.Close()

	// SIGTERM reaches the command; after ShutdownTimeout the power
	// button, then a hard stop.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	go func() {
		for s := range sigs {
			j.Signal(s.(syscall.Signal))
		}
	}()
	st := j.Run(context.Background(), vm)
	fmt.Println(st.ExitCode(), st)
}
