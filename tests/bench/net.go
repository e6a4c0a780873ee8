package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/hpcvmm/hpcvmm/tests/harness"
)

// The network of the virtio-net case: L1's end of the TAP and the guest.
// tests/guest/init's "net" scenario sends hpcvmm.net_mib MiB to the peer's
// port 5001, then receives as many from its port 5002, timing both with
// the guest's clock.
const (
	netTAP   = "hpvbench0"
	netPeer  = "10.78.0.1"
	netGuest = "10.78.0.2"
)

const caseNet = "net" // cases "net/vhost=on|off"

// Metrics of the network case.
const (
	mNetTxMiBps = "guest_to_l1_mib_per_s" // guest → L1, the guest's timing of its nc
	mNetRxMiBps = "l1_to_guest_mib_per_s" // L1 → guest, likewise
)

func netCase(vhost string) string { return caseNet + "/vhost=" + vhost }

// netArgv is the command line of one network run: the launch case's guest
// plus one virtio-net device on netTAP. QEMU gets q35 with virtio-net-pci
// (the L2 initramfs has virtio_pci but not virtio_mmio, which microvm's
// virtio devices would need) and no option ROM.
func netArgv(cfg Config, vmm, vhost string) ([]string, error) {
	c := cfg
	c.Cmdline = fmt.Sprintf("console=ttyS0 reboot=k panic=-1 hpcvmm.scenario=net hpcvmm.net_addr=%s hpcvmm.net_peer=%s hpcvmm.net_mib=%d",
		netGuest, netPeer, cfg.NetMiB)
	argv, err := launchArgv(c, vmm)
	if err != nil {
		return nil, err
	}
	switch vmm {
	case vmmHPCVMM:
		return append(argv, "--net", "tap="+netTAP+",vhost="+vhost), nil
	case vmmQEMUQ35:
		return append(argv, "-netdev", "tap,id=n0,ifname="+netTAP+",script=no,downscript=no,vhost="+vhost,
			"-device", "virtio-net-pci,netdev=n0,romfile="), nil
	}
	return nil, fmt.Errorf("no network case for %s", vmm)
}

// runNet boots the guest with a virtio-net device, serves the guest's two
// transfers and reports their throughput and the KVM exits while they ran.
// Long on purpose: one boot and its two transfers, step by step.
func runNet(ctx context.Context, cfg Config, vmm, vhost string, rep int, payload []byte) Sample {
	s := newSample(netCase(vhost), vmm, cfg.Where, rep)
	argv, err := netArgv(cfg, vmm, vhost)
	if err != nil {
		s.Err = err.Error()
		return s
	}
	s.Info["argv"] = strings.Join(argv, " ")
	// Both VMMs create the TAP (TUNSETIFF on a missing name creates it)
	// and it goes away when they exit; the suite gives L1's end its
	// address once it exists.
	lnRx, err := net.Listen("tcp", "0.0.0.0:5001")
	if err != nil {
		s.Err = fmt.Sprintf("listening on 5001: %v", err)
		return s
	}
	defer lnRx.Close()
	lnTx, err := net.Listen("tcp", "0.0.0.0:5002")
	if err != nil {
		s.Err = fmt.Sprintf("listening on 5002: %v", err)
		return s
	}
	defer lnTx.Close()

	cmd := exec.Command(argv[0], argv[1:]...)
	stdout := newWatch("HPCVMM-GUEST-MARKER done")
	stderr := newWatch("first KVM_RUN")
	cmd.Stdout, cmd.Stderr = stdout, stderr
	p, err := startVMM(cmd, func(t time.Time) { stdout.start, stderr.start = t, t })
	if err != nil {
		s.Err = err.Error()
		return s
	}
	defer p.stdin.Close()
	defer stopVMM(cmd, vmm, p.exited)
	exited, pid := p.exited, cmd.Process.Pid
	ctx, cancel := context.WithTimeout(ctx, cfg.NetTimeout)
	defer cancel()

	if err := waitForTAP(ctx, exited); err != nil {
		s.Err = err.Error() + "; console tail: " + tail(stdout.String(), 400) + "; stderr tail: " + tail(stderr.String(), 400)
		return s
	}
	if err := configureTAP(); err != nil {
		s.Err = err.Error()
		return s
	}

	// Guest → L1: the exits from here to the end of the L1 → guest
	// transfer are the transfer's.
	c, err := acceptCtx(ctx, lnRx)
	if err != nil {
		// Whether the VMM is still running tells a guest that stopped from
		// a VMM that died (its log's end says how).
		state := "still running"
		select {
		case <-exited:
			state = fmt.Sprintf("exited: %v", p.waitErr)
		default:
			s.Info["stall"] = stallReport(vmm, pid, exited, stderr.String)
		}
		s.Err = fmt.Sprintf("the guest never connected to port 5001: %v; %s %s; console tail: %q; log tail: %q",
			err, vmm, state, tail(stdout.String(), 600), tail(stderr.String(), 400))
		return s
	}
	before, kerr := readKVMStats(kvmDebugfs, "/proc", pid)
	n, err := io.Copy(io.Discard, c)
	c.Close()
	if err != nil || n != int64(len(payload)) {
		s.Err = fmt.Sprintf("guest → L1: %d of %d bytes: %v", n, len(payload), err)
		return s
	}
	c, err = acceptCtx(ctx, lnTx)
	if err != nil {
		s.Err = fmt.Sprintf("the guest never connected to port 5002: %v", err)
		return s
	}
	_, err = c.Write(payload)
	c.Close()
	if err != nil {
		s.Err = fmt.Sprintf("L1 → guest: %v", err)
		return s
	}
	select {
	case <-stdout.hit:
	case <-exited:
	case <-ctx.Done():
	}
	after, kerr2 := readKVMStats(kvmDebugfs, "/proc", pid)
	if kerr == nil && kerr2 == nil {
		for k, v := range after {
			s.Metrics["xfer.kvm."+k] = v - before[k]
		}
	}
	g, _ := harness.ParseGuestResults(stdout.String())
	mib := float64(len(payload)) / (1 << 20)
	if sec, err := strconv.ParseFloat(g["net_tx_seconds"], 64); err == nil && sec > 0 {
		s.Metrics[mNetTxMiBps] = mib / sec
	}
	if sec, err := strconv.ParseFloat(g["net_rx_seconds"], 64); err == nil && sec > 0 && g["net_rx_bytes"] == strconv.Itoa(len(payload)) {
		s.Metrics[mNetRxMiBps] = mib / sec
	}
	s.Info["guest_driver"] = g["net_eth0_driver"]
	if len(s.Metrics) == 0 || g["net_ping"] != "ok" {
		s.Err = fmt.Sprintf("no transfer times from the guest (ping %q); console tail: %q", g["net_ping"], tail(stdout.String(), 600))
	}
	return s
}

// runNets measures every network configuration NetReps times.
func runNets(ctx context.Context, cfg Config, out sink) {
	payload := make([]byte, cfg.NetMiB<<20)
	if _, err := rand.Read(payload); err != nil {
		out.note("virtio-net: " + err.Error())
		return
	}
	failed := map[string]bool{}
	for rep := 1; rep <= cfg.NetReps; rep++ {
		for _, vhost := range []string{"off", "on"} {
			for _, vmm := range []string{vmmHPCVMM, vmmQEMUQ35} {
				key := vmm + vhost
				if failed[key] || cfg.FailedRuns[netCase(vhost)+"|"+vmm] >= maxFailures || cfg.done(netCase(vhost), vmm, rep) {
					continue
				}
				if ctx.Err() != nil {
					out.note("virtio-net: stopped: time budget")
					return
				}
				out.progress(fmt.Sprintf("net %s vhost=%s run %d", vmm, vhost, rep))
				s := runNet(ctx, cfg, vmm, vhost, rep, payload)
				if ctx.Err() != nil && s.Err != "" {
					// The suite's clock, not the VMM, ended this run.
					out.note(fmt.Sprintf("virtio-net %s vhost=%s: run %d cut short by the time budget; not counted", vmm, vhost, rep))
					return
				}
				out.sample(s)
				if s.Err != "" {
					// Tried again once (the test bed's L2s stall now
					// and then), as one more run after the last.
					failed[key] = true
					out.note(fmt.Sprintf("virtio-net %s vhost=%s: run %d failed: %s", vmm, vhost, rep, s.Err))
					if cfg.FailedRuns[netCase(vhost)+"|"+vmm]+1 < maxFailures && ctx.Err() == nil {
						out.progress(fmt.Sprintf("net %s vhost=%s run %d (again)", vmm, vhost, rep+1))
						if r := runNet(ctx, cfg, vmm, vhost, rep+1, payload); ctx.Err() == nil || r.Err == "" {
							out.sample(r)
						}
					}
				}
			}
		}
	}
}

func configureTAP() error {
	if err := ip("addr", "add", netPeer+"/24", "dev", netTAP); err != nil {
		return err
	}
	return ip("link", "set", netTAP, "up")
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// waitForTAP waits for the VMM to create netTAP.
func waitForTAP(ctx context.Context, exited <-chan struct{}) error {
	for {
		if _, err := net.InterfaceByName(netTAP); err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("the VMM exited before creating TAP %s", netTAP)
		case <-ctx.Done():
			return fmt.Errorf("TAP %s did not appear: %w", netTAP, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// acceptCtx accepts one connection or gives up when ctx ends.
func acceptCtx(ctx context.Context, ln net.Listener) (net.Conn, error) {
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	select {
	case r := <-ch:
		return r.c, r.err
	case <-ctx.Done():
		ln.Close() // ends the Accept
		return nil, ctx.Err()
	}
}
