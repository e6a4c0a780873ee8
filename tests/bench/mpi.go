package main

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/hpcvmm/hpcvmm/tests/harness"
)

// caseMPI (issue 25) runs tests/guest/mpiapp's pingpong mode (1-byte
// round trips and 1 MiB messages between ranks 0 and 1) as a two-node
// Slurm job in harness.ProfileSlurm's L1, once with each rank in a VM of
// its own (`srun --mpi=pmi2 -N2 --ntasks-per-node=1 hpcvmm run --rootfs
// MPIRoot --net tap=…+rank,bridge=…,ip=…+rank -- /mpi_app pingpong`: the
// two guests talk over virtio-net, TAPs and L1's bridge) and once natively
// on the two slurmd nodes (the same binary and libraries, over L1's
// loopback), alternating. It needs the Slurm L1, so it runs only when
// -cases names it, in an L1 of its own.
const caseMPI = "mpi"

// VMM names of the mpi case.
const (
	vmmMPIVMs    = "hpcvmm-vms"
	vmmMPINative = "native"
	// vmmMPINativeTCP is the native control with UCX held to TCP
	// (UCX_TLS=tcp,self): the transport two separate nodes without
	// InfiniBand would use, where plain native ranks on the one L1 may
	// take a shared-memory path no two nodes have.
	vmmMPINativeTCP = "native-tcp"
)

// MPI case metrics, from rank 0's line.
const (
	mMPILatUs = "lat_us"   // one 1-byte round trip, µs
	mMPIBwMiB = "bw_mib_s" // 1 MiB messages, MiB/s
	mMPISrun  = "srun_ms"  // srun's start to its exit
)

// The mpi case's guests: one vCPU, 512 MiB on 4 KiB pages each, their
// TAPs on the Slurm cluster's bridge (as TestMPIAcrossVMs).
const (
	mpiTap = "hpvbench+rank"
	mpiIP  = "10.78.0.40/24+rank"
)

// wantsMPI reports whether cases names the mpi case; it never runs as
// part of "all cases" (it needs a second L1 boot of its own).
func wantsMPI(cases []string) bool { return slices.Contains(cases, caseMPI) }

// mpiSrunArgs is srun's command line for vmm.
func mpiSrunArgs(cfg Config, vmm string) []string {
	a := []string{"--mpi=pmi2", "-N2", "--ntasks-per-node=1", "--mem=2048", "--time=20"}
	switch vmm {
	case vmmMPINative:
		return append(a, "--export=ALL,LD_LIBRARY_PATH="+harness.MPILibraryPath, harness.MPIRoot+harness.MPIApp, "pingpong")
	case vmmMPINativeTCP:
		return append(a, "--export=ALL,LD_LIBRARY_PATH="+harness.MPILibraryPath+",UCX_TLS=tcp,self", harness.MPIRoot+harness.MPIApp, "pingpong")
	}
	// The test bed's CPU mode (harness.TestbedCPUMode says why).
	return append(a, cfg.HPCVMM, "run", "--kernel", cfg.Kernel, "--cpus", "1", "--memory", "512M", "--hugepages", "none",
		"--cpu-mode", harness.TestbedCPUMode, "--rootfs", harness.MPIRoot, "--net", "tap="+mpiTap+",bridge="+harness.SlurmBridge+",ip="+mpiIP,
		"--", harness.MPIApp, "pingpong")
}

// runMPIs runs the mpi case: Reps runs of each, alternating.
func runMPIs(ctx context.Context, cfg Config, out sink) {
	for rep := 1; rep <= cfg.Reps; rep++ {
		for _, v := range []string{vmmMPIVMs, vmmMPINative, vmmMPINativeTCP} {
			if cfg.done(caseMPI, v, rep) {
				continue
			}
			if ctx.Err() != nil {
				out.note(fmt.Sprintf("mpi case: stopped before %s run %d: time budget", v, rep))
				return
			}
			out.progress(fmt.Sprintf("mpi %s run %d", v, rep))
			out.sample(runMPI(ctx, cfg, v, rep))
		}
	}
}

// runMPI runs srun once for vmm and parses rank 0's line.
func runMPI(ctx context.Context, cfg Config, vmm string, rep int) Sample {
	s := newSample(caseMPI, vmm, cfg.Where, rep)
	args := mpiSrunArgs(cfg, vmm)
	s.Info["argv"] = "srun " + strings.Join(args, " ")
	limit := cfg.MPITimeout
	if limit <= 0 {
		limit = 5 * time.Minute
	}
	rctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := exec.CommandContext(rctx, "srun", args...)
	var stdout, stderr testenv.LockedBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// A guest lost to the emulator (an early triple fault, docs/testbed.md)
	// ends its hpcvmm before the rank's PMI client spoke; Slurm's mpi/pmi2
	// then dies and srun would wait until the limit: stop such a run now.
	lost := make(chan struct{})
	go func() {
		for rctx.Err() == nil {
			if strings.Contains(stderr.String(), "KVM_EXIT_SHUTDOWN") {
				close(lost)
				cancel()
				return
			}
			time.Sleep(500 * time.Millisecond)
		}
	}()
	// srun passes SIGTERM on to the step, which stops hpcvmm cleanly (a
	// single SIGINT only makes srun print the step's state).
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 20 * time.Second
	start := time.Now()
	err := cmd.Run()
	elapsed := time.Since(start)
	select {
	case <-lost:
		s.Err = "a guest triple-faulted in early boot (the emulator's, docs/testbed.md); run stopped; stderr: " + tail(stderr.String(), 300)
		return s
	default:
	}
	switch {
	case rctx.Err() != nil:
		s.Err = fmt.Sprintf("srun did not finish within %v; stderr: %s", limit, tail(stderr.String(), 600))
		return s
	case err != nil:
		s.Err = fmt.Sprintf("srun: %v; stderr: %s", err, tail(stderr.String(), 600))
		return s
	}
	res, err := parseMPIPingPong(stdout.String())
	if err != nil {
		s.Err = err.Error() + "; stderr: " + tail(stderr.String(), 300)
		return s
	}
	for k, v := range res {
		s.Metrics[k] = v
	}
	s.Metrics[mMPISrun] = ms(elapsed)
	return s
}

// parseMPIPingPong reads mpi_app's line "pingpong lat_us=L bw_mib_s=B"
// (rank 0's) into metrics; both must be positive numbers.
func parseMPIPingPong(stdout string) (map[string]float64, error) {
	sc := bufio.NewScanner(strings.NewReader(stdout))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		rest, ok := strings.CutPrefix(line, "pingpong ")
		if !ok {
			continue
		}
		kv := map[string]float64{}
		for _, f := range strings.Fields(rest) {
			k, v, ok := strings.Cut(f, "=")
			if !ok {
				return nil, fmt.Errorf("mpi_app output %q: field %q is not KEY=VALUE", line, f)
			}
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return nil, fmt.Errorf("mpi_app output %q: %s: %w", line, k, err)
			}
			kv[k] = x
		}
		out := map[string]float64{}
		for _, m := range []string{mMPILatUs, mMPIBwMiB} {
			v, ok := kv[m]
			if !ok || !(v > 0) || v > 1e12 {
				return nil, fmt.Errorf("mpi_app output %q: no positive %s", line, m)
			}
			out[m] = v
		}
		return out, nil
	}
	return nil, fmt.Errorf("no \"pingpong lat_us=… bw_mib_s=…\" line in srun's stdout %q", tail(stdout, 300))
}

// renderMPI renders the mpi case's table ("" when it did not run).
func renderMPI(ix statIndex, where, whereText string) string {
	if !found(ix, where, caseMPI, vmmMPIVMs, vmmMPINative) {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n**MPI across VMs (issue 25): two ranks on two Slurm nodes, in a VM each vs natively** (%s; tests/guest/mpiapp `pingpong` "+
		"(MPICH over UCX): rank 0's average of 200 1-byte round trips and the bandwidth of 20 1 MiB messages; "+
		"VMs: `srun --mpi=pmi2 -N2 --ntasks-per-node=1 hpcvmm run --cpus 1 --memory 512M --hugepages none --cpu-mode shared --rootfs %s --net tap=%s,bridge=%s,ip=%s -- %s pingpong` "+
		"(virtio-net, a TAP per guest on L1's bridge); native: `srun --mpi=pmi2 -N2 --ntasks-per-node=1 %s%s pingpong` on the same two slurmd nodes (one L1: UCX may use shared memory); "+
		"native TCP: the same with UCX_TLS=tcp,self (L1's loopback, as two nodes without InfiniBand); "+
		"median (min–max); ratios: latency > 1 and bandwidth < 1 mean the VMs are slower)\n\n",
		whereText, harness.MPIRoot, mpiTap, harness.SlurmBridge, mpiIP, harness.MPIApp, harness.MPIRoot, harness.MPIApp)
	b.WriteString("| metric | VMs (hpcvmm) | native | native TCP | VM/native | VM/native TCP |\n| --- | ---: | ---: | ---: | ---: | ---: |\n")
	cell := func(v, m string, prec int) (string, Stat, bool) {
		st, ok := ix.get(where, caseMPI, v, m)
		if !ok {
			if failed, _ := ix.failures(where, caseMPI, v); failed > 0 {
				return fmt.Sprintf("failed (%d)", failed), st, false
			}
			return "–", st, false
		}
		return medianCell(ix, where, caseMPI, v, st, ok, prec), st, true
	}
	for _, m := range []struct {
		metric, label string
		prec          int
	}{{mMPILatUs, "latency (µs per 1-byte round trip)", 1}, {mMPIBwMiB, "bandwidth (MiB/s, 1 MiB messages)", 1}, {mMPISrun, "whole srun (ms)", 0}} {
		vs, vst, vok := cell(vmmMPIVMs, m.metric, m.prec)
		ns, nst, nok := cell(vmmMPINative, m.metric, m.prec)
		ts, tst, tok := cell(vmmMPINativeTCP, m.metric, m.prec)
		r, rt := "", ""
		if vok && nok {
			r = fmtRatio(ratio(vst.Median, nst.Median))
		}
		if vok && tok {
			rt = fmtRatio(ratio(vst.Median, tst.Median))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", m.label, vs, ns, ts, r, rt)
	}
	return b.String()
}
