// Command bench is hpcvmm's side-by-side benchmark suite: it measures
// hpcvmm and its peers (QEMU with -M microvm and -M q35, gokvm) in one run
// on the same machine and writes a Markdown table and a JSON file.
//
//	go run ./tests/bench                       # everything, under 15 minutes
//	go run ./tests/bench -reps 3 -out /tmp/b   # fewer runs per case
//
// Cases (issue 8): launch to the guest's /init marker (1 vCPU, 512 MiB on
// prefaulted 2 MiB hugetlb pages for hpcvmm and QEMU, or 4 KiB pages with
// -launch-pages 4K; the same stock kernel, initramfs and command line for
// every VMM); the same launch with each VMM's defaults (no tuning flags;
// 1 vCPU/1 GiB and 4 vCPUs/4 GiB; hpcvmm and QEMU microvm); hpcvmm's memory
// beyond guest RAM with its devices added one at a time; process start to
// the first KVM_RUN (hpcvmm); guest RAM
// prefault throughput by page size and worker count, against QEMU's memory
// backend with the same options; KVM exits by reason during boot and during
// a virtio-net and a virtio-console transfer from KVM's own statistics; the
// VMM's resident memory beyond guest RAM; the time in VFIO_IOMMU_MAP_DMA and
// the number of calls to DMA-map 1-4 GiB of guest RAM on each page size, with
// a device passed through (L1 only, dmamap.go); jobs (jobs.go, issues 26
// and 27): `hpcvmm run --rootfs BUSYBOX -- true` in two parts against QEMU
// microvm running true from its /init, a guest-side wake-up ping-pong with
// --cpu-mode dedicated against shared, and, on the host, the initramfs
// build of a 512 MiB rootfs and its cache hit against find | cpio; and, on
// the host only, the
// prefault scaling case (scaling.go): guestmem.New on 16 GiB of 2 MiB and 1
// GiB pages with 1 up to all of the node's CPUs, beside the machine's write
// bandwidth; and, only when -cases names it, MPI across VMs (mpi.go, issue
// 25): tests/guest/mpiapp's ping-pong between two ranks of a two-node Slurm
// job, each rank in a VM of its own (virtio-net) against the same program
// natively, in an L1 of its own booted with harness.ProfileSlurm. Each case runs -reps times per VMM; the tables give median, min
// and max and the ratio hpcvmm/peer.
//
// Where: booting guests needs hardware KVM. On a host without it (no
// /dev/kvm, or the kvm_pvm backend) the suite boots one L1 guest of the
// nested test bed (tests/harness, ProfileBench) and runs there, carrying
// QEMU with its libraries and firmware and gokvm into L1; absolute times
// from the emulated L1 are only good for ratios. The prefault cases need no
// KVM and also run on the host itself, where their absolute GiB/s mean
// something. `-cases prefault-scaling` alone builds nothing and needs only
// hugepages: it runs on any host, as root with -scaling-reserve.
//
// The suite is a command, not a test, so the default `go test ./...` never
// runs it. Its own unit tests (parsing, statistics, tables) are fast.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
)

func main() {
	if os.Getenv("HPCVMM_TEST_WHERE") == "inside" {
		// Started by L1's /init (harness.RunL1Program).
		os.Exit(runInsideL1())
	}
	os.Exit(runOuter(os.Args[1:]))
}

// runInsideL1 runs the suite inside L1 with the configuration the outer
// side packed into the image and reports on the result port.
func runInsideL1() int {
	b, err := os.ReadFile(l1ConfigPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: reading the configuration:", err)
		return 1
	}
	var cfg Config
	if err := json.Unmarshal(b, &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %s: %v\n", l1ConfigPath, err)
		return 1
	}
	port := os.Getenv("HPCVMM_TEST_RESULTS")
	if port == "" {
		port = "/dev/ttyS1"
	}
	rs, err := openRecordSink(port)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	defer rs.close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	runSuite(ctx, cfg, rs)
	rs.done()
	return 0
}

// parseFlags is split out so the flag set is testable.
func parseFlags(args []string) (options, error) {
	o := defaultOptions()
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.StringVar(&o.where, "where", o.where, "auto (host when /dev/kvm is hardware KVM, else l1), host or l1")
	fs.IntVar(&o.reps, "reps", o.reps, "runs per case and VMM")
	fs.Func("binds-vmms", "binds: comma-separated configurations to run, e.g. l1-native,hpcvmm-512K-mmap,hpcvmm-512K-loose,qemu-q35-virtio-9p (default: all)", func(v string) error {
		known := bindsVMMs()
		for _, n := range strings.Split(v, ",") {
			if !slices.Contains(known, n) {
				return fmt.Errorf("-binds-vmms: %q is not one of %s", n, strings.Join(known, ", "))
			}
			o.bindsVMMs = append(o.bindsVMMs, n)
		}
		return nil
	})
	fs.DurationVar(&o.timeout, "timeout", o.timeout, "limit for the L1 boot that runs the suite")
	fs.StringVar(&o.out, "out", o.out, "directory for bench-DATE.json and bench-DATE.md (default: the harness cache's bench/)")
	fs.StringVar(&o.gokvm, "gokvm", o.gokvm, "module@version of gokvm to build with go install")
	fs.BoolVar(&o.hostPrefault, "host-prefault", o.hostPrefault, "also run the prefault cases on this host (they need no KVM)")
	fs.IntVar(&o.hostHugepages, "host-hugepages", o.hostHugepages, "temporarily raise this host's 2 MiB pool by this many pages, and its 1 GiB pool by the 2 pages its case needs, for the host prefault cases (both restored afterwards); 0 uses what is free")
	fs.IntVar(&o.memoryMiB, "memory", o.memoryMiB, "guest RAM of the launch case in MiB")
	fs.StringVar(&o.render, "render", "", "only re-render the Markdown of an earlier bench-*.json to stdout")
	fs.StringVar(&o.launchPages, "launch-pages", o.launchPages, "guest RAM of the booting cases: 2M (hpcvmm --hugepages 2M, QEMU a prefaulted 2 MiB hugetlb memfd backend) or 4K (hpcvmm --hugepages none, QEMU its default RAM)")
	cases := fs.String("cases", "", "comma-separated cases to run: launch, defaults, memory, net, console, prefault, dma-map, prefault-scaling, job, job-build, pingpong, mpi, binds (default: all but mpi and binds; prefault-scaling alone builds nothing and needs only hugepages; mpi boots an L1 of its own with the Slurm cluster; binds: 9P binds against QEMU's virtio-9p, binds.go)")
	fs.IntVar(&o.scaling.gib, "scaling-gib", o.scaling.gib, "prefault-scaling: guest RAM per run in GiB (the case is specified at 16 or more)")
	fs.IntVar(&o.scaling.node, "scaling-node", o.scaling.node, "prefault-scaling: NUMA node for the RAM and the workers' CPUs (-1: the node of the first CPU this process may use)")
	fs.IntVar(&o.scaling.rounds, "scaling-rounds", o.scaling.rounds, "prefault-scaling: measured rounds per worker count and page size")
	fs.BoolVar(&o.scaling.reserve, "scaling-reserve", o.scaling.reserve, "prefault-scaling: raise the node's 2 MiB and 1 GiB pools by what the case needs and restore them afterwards (root)")
	scalingWorkersFlag := fs.String("scaling-workers", "", "prefault-scaling: comma-separated worker counts (default: 1, 2, 4, ... and all of the node's CPUs this process may use)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if *cases != "" {
		for _, c := range strings.Split(*cases, ",") {
			switch c = strings.TrimSpace(c); c {
			case caseLaunch, caseDefaults, caseMemory, caseNet, caseConsole, casePrefault, caseDMAMap, casePrefaultScaling, caseJob, caseJobBuild, casePingPong, caseMPI, caseBinds:
				o.cases = append(o.cases, c)
			default:
				return o, fmt.Errorf("-cases: unknown case %q: want launch, defaults, memory, net, console, prefault, dma-map, prefault-scaling, job, job-build, pingpong, mpi or binds", c)
			}
		}
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *scalingWorkersFlag != "" {
		w, err := parseWorkerList(*scalingWorkersFlag)
		if err != nil {
			return o, err
		}
		o.scaling.workers = w
	}
	if o.scaling.gib < 1 {
		return o, fmt.Errorf("-scaling-gib %d: want at least 1 (GiB; the case is specified at 16)", o.scaling.gib)
	}
	if o.scaling.rounds < 1 {
		return o, fmt.Errorf("-scaling-rounds %d: want at least 1", o.scaling.rounds)
	}
	if o.scaling.node < -1 {
		return o, fmt.Errorf("-scaling-node %d: want a node number or -1", o.scaling.node)
	}
	switch o.where {
	case "auto", whereHost, whereL1:
	default:
		return o, fmt.Errorf("-where %q: want auto, host or l1", o.where)
	}
	if o.reps < 1 {
		return o, fmt.Errorf("-reps %d: want at least 1", o.reps)
	}
	if o.launchPages != pages2M && o.launchPages != pages4K {
		return o, fmt.Errorf("-launch-pages %q: want 2M or 4K", o.launchPages)
	}
	if o.memoryMiB < 64 {
		return o, fmt.Errorf("-memory %d: want at least 64 (MiB)", o.memoryMiB)
	}
	if o.launchPages == pages2M && o.memoryMiB%2 != 0 {
		return o, fmt.Errorf("-memory %d with -launch-pages 2M: want a multiple of 2 (MiB)", o.memoryMiB)
	}
	return o, nil
}

func runOuter(args []string) int {
	o, err := parseFlags(args)
	if err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 2
	}
	if o.render != "" {
		b, err := os.ReadFile(o.render)
		if err == nil {
			var rep Report
			if err = json.Unmarshal(b, &rep); err == nil {
				fmt.Print(renderMarkdown(&rep))
				return 0
			}
		}
		fmt.Fprintf(os.Stderr, "bench: -render %s: %v\n", o.render, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	rep, err := outer(ctx, o)
	if rep != nil {
		if werr := writeOutputs(o, rep); werr != nil {
			fmt.Fprintln(os.Stderr, "bench:", werr)
			return 1
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	return 0
}
