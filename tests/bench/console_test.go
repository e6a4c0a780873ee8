package main

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLaunchArgvPages(t *testing.T) {
	cfg := Config{Kernel: "/k", Initrd: "/i", Cmdline: "c", MemoryMiB: 512, HPCVMM: "/h", QEMU: "/q", GoKVM: "/g", LaunchPages: pages2M}
	argv, err := launchArgv(cfg, vmmHPCVMM)
	require.NoError(t, err)
	assert.Contains(t, strings.Join(argv, " "), "--memory 512M --kernel-cache "+benchKernelCache+" --hugepages 2M --console serial")
	argv, err = launchArgv(cfg, vmmHPCVMMGuestKernel)
	require.NoError(t, err)
	assert.Contains(t, strings.Join(argv, " "), "--kernel-decompress guest --hugepages 2M --console serial")
	for _, v := range []string{vmmQEMUMicrovm, vmmQEMUQ35} {
		argv, err = launchArgv(cfg, v)
		require.NoError(t, err)
		assert.Contains(t, strings.Join(argv, " "),
			"-m 512M -nodefaults -no-user-config -display none -no-reboot -serial stdio -kernel /k -initrd /i -append c "+
				"-object memory-backend-memfd,id=ram,size=512M,hugetlb=on,hugetlbsize=2M,share=on,prealloc=on -machine memory-backend=ram", v)
	}
	argv, _ = launchArgv(cfg, vmmGoKVM)
	assert.NotContains(t, strings.Join(argv, " "), "huge", "gokvm cannot choose its backing")

	cfg.LaunchPages = pages4K
	argv, _ = launchArgv(cfg, vmmHPCVMM)
	assert.Contains(t, strings.Join(argv, " "), "--hugepages none")
	argv, _ = launchArgv(cfg, vmmQEMUQ35)
	assert.NotContains(t, strings.Join(argv, " "), "memory-backend")
	cfg.LaunchPages = ""
	assert.Equal(t, pages4K, cfg.launchPages(), "reports from before -launch-pages ran on 4 KiB pages")
}

func TestRAMBackingLineNamesEveryVMM(t *testing.T) {
	l := ramBackingLine(Config{MemoryMiB: 512, LaunchPages: pages2M})
	for _, want := range []string{"(2M pages)", "hpcvmm: `--hugepages 2M`", "QEMU (microvm and q35): `-object memory-backend-memfd,id=ram,size=512M,hugetlb=on",
		"gokvm: its own anonymous RAM"} {
		assert.Contains(t, l, want)
	}
	l = ramBackingLine(Config{MemoryMiB: 512})
	assert.Contains(t, l, "hpcvmm: `--hugepages none`")
	assert.Contains(t, l, "QEMU (microvm and q35): its default anonymous RAM")
}

func TestParseFlagsPagesAndConsole(t *testing.T) {
	o, err := parseFlags(nil)
	require.NoError(t, err)
	assert.Equal(t, pages2M, o.launchPages, "hugepages by default: hpcvmm's real configuration")
	o, err = parseFlags([]string{"-launch-pages", "4K", "-cases", "launch,console"})
	require.NoError(t, err)
	assert.Equal(t, pages4K, o.launchPages)
	assert.Equal(t, []string{caseLaunch, caseConsole}, o.cases)
	for _, bad := range [][]string{{"-launch-pages", "1G"}, {"-launch-pages", "2m"}, {"-memory", "513"}} {
		_, err := parseFlags(bad)
		assert.Error(t, err, "%v", bad)
	}
	_, err = parseFlags([]string{"-memory", "513", "-launch-pages", "4K"})
	assert.NoError(t, err, "an odd MiB count is fine on 4 KiB pages")
}

func TestConsoleArgv(t *testing.T) {
	cfg := Config{Kernel: "/k", Initrd: "/i", Cmdline: "console=ttyS0 hpcvmm.scenario=boot", MemoryMiB: 512, HPCVMM: "/h", QEMU: "/q", LaunchPages: pages2M}
	argv, err := consoleArgv(cfg, vmmHPCVMM, "")
	require.NoError(t, err)
	j := strings.Join(argv, " ")
	assert.Contains(t, j, "--hugepages 2M --console virtio")
	assert.Contains(t, argv, consoleCmdline)
	assert.NotContains(t, j, "scenario=boot")
	argv, err = consoleArgv(cfg, vmmQEMUQ35, "/tmp/x/c0")
	require.NoError(t, err)
	j = strings.Join(argv, " ")
	assert.Contains(t, j, "-M q35")
	assert.Contains(t, j, "hugetlb=on")
	assert.Contains(t, j, "-S -qmp unix:/tmp/x/c0.qmp,server=on,wait=off -device virtio-serial-pci,id=vser0")
	assert.Contains(t, argv, consoleCmdline)
	_, err = consoleArgv(cfg, vmmQEMUMicrovm, "/tmp/x/c0")
	assert.Error(t, err, "microvm's guest has no virtio_mmio")
	_, err = consoleArgv(cfg, vmmGoKVM, "")
	assert.Error(t, err)
}

func TestStreamMarkersAcrossWrites(t *testing.T) {
	s := newStream(hvcReady, blobBegin, blobEnd)
	s.setStart(time.Now())
	_, _ = s.Write([]byte("boot\nHPCVMM-HVC0 rea"))
	select {
	case <-s.mark(hvcReady).hit:
		t.Fatal("marker reported before it was complete")
	default:
	}
	_, _ = s.Write([]byte("dy\nHPCVMM-HVC0 echo:x\nHPCVMM-BLOB-B"))
	<-s.mark(hvcReady).hit
	_, _ = s.Write([]byte("EGIN\n\x00\x01\nhpcvmm-guest fake=1\n"))
	_, _ = s.Write([]byte("\xffHPCVMM-BLOB-END\nhpcvmm-guest blob_bytes=5\nHPCVMM-GUEST-MARKER done\n"))
	<-s.mark(blobBegin).hit
	<-s.mark(blobEnd).hit
	assert.False(t, s.mark(blobEnd).when().Before(s.mark(blobBegin).when()))
	blob, err := s.between(blobBegin, blobEnd)
	require.NoError(t, err)
	assert.Equal(t, []byte("\x00\x01\nhpcvmm-guest fake=1\n\xff"), blob)
	out := s.textOutside()
	assert.NotContains(t, out, "fake=1", "the blob's bytes are not parsed as guest results")
	assert.Contains(t, out, "HPCVMM-BLOB-BEGIN\nHPCVMM-BLOB-END\nhpcvmm-guest blob_bytes=5\n")
	assert.Contains(t, out, "boot\n")
}

func TestFramed(t *testing.T) {
	_, err := framed([]byte("nothing"), blobBegin, blobEnd)
	assert.ErrorContains(t, err, "HPCVMM-BLOB-BEGIN")
	_, err = framed([]byte("HPCVMM-BLOB-END\nHPCVMM-BLOB-BEGIN\nabc"), blobBegin, blobEnd)
	assert.ErrorContains(t, err, "no \"HPCVMM-BLOB-END\" after")
	b, err := framed([]byte("HPCVMM-BLOB-BEGIN\nHPCVMM-BLOB-END\n"), blobBegin, blobEnd)
	require.NoError(t, err)
	assert.Empty(t, b)
	buf := []byte("a\nHPCVMM-BLOB-BEGIN\nxyz")
	assert.Equal(t, "a\nHPCVMM-BLOB-BEGIN\n[blob still arriving]\n", string(cutFramed(buf, blobBegin, blobEnd)))
	assert.Equal(t, "a\nHPCVMM-BLOB-BEGIN\nxyz", string(buf), "cutFramed leaves the stream alone")
	assert.Equal(t, "plain", string(cutFramed([]byte("plain"), blobBegin, blobEnd)))
}

func TestFollowFile(t *testing.T) {
	base := filepath.Join(t.TempDir(), "c0")
	in, out, err := openConsoleFiles(base)
	require.NoError(t, err)
	defer in.Close()
	defer out.Close()
	st := newStream(blobEnd)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { followFile(out, st, stop); close(done) }()
	// QEMU's side: it truncates and appends to base.out, reads base.in.
	w, err := os.OpenFile(base+".out", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0)
	require.NoError(t, err)
	_, _ = w.WriteString("abc")
	_, _ = w.WriteString("HPCVMM-BLOB-END\n")
	<-st.mark(blobEnd).hit
	_, _ = w.WriteString("tail")
	w.Close()
	close(stop)
	<-done
	assert.Equal(t, "abcHPCVMM-BLOB-END\ntail", string(st.buf), "what came after the marker is drained at stop")
	r, err := os.OpenFile(base+".in", os.O_RDONLY, 0)
	require.NoError(t, err)
	defer r.Close()
	_, _ = in.WriteString("go\n")
	b := make([]byte, 3)
	_, err = r.Read(b)
	require.NoError(t, err)
	assert.Equal(t, "go\n", string(b))
	_, _, err = openConsoleFiles(base)
	assert.Error(t, err, "the files exist already")
}

func TestRenderConsole(t *testing.T) {
	var samples []Sample
	add := func(vmm string, rep int, m map[string]float64) {
		s := newSample(caseConsole, vmm, whereL1, rep)
		s.Metrics = m
		samples = append(samples, s)
	}
	for rep, v := range []float64{4, 5, 6} {
		add(vmmHPCVMM, rep+1, map[string]float64{mConsoleGuestMiBps: v, mConsoleHostMiBps: v - 1, mConsoleBytes: 16 << 20, "xfer.kvm.exits": 4000, "xfer.kvm.io_exits": 100})
	}
	add(vmmQEMUQ35, 1, map[string]float64{mConsoleGuestMiBps: 2.5, mConsoleHostMiBps: 2, mConsoleBytes: 16 << 20, "xfer.kvm.exits": 8000, "xfer.kvm.io_exits": 50})
	l := newSample(caseLaunch, vmmHPCVMM, whereL1, 1)
	l.Metrics[mHPCVMMPrefault] = 300
	samples = append(samples, l)
	bad := newSample(caseConsole, vmmQEMUQ35, whereL1, 2)
	bad.Err = "stuck"
	samples = append(samples, bad)
	rep := &Report{Samples: samples, Config: Config{Where: whereL1, MemoryMiB: 512, LaunchPages: pages2M}}
	md := renderMarkdown(rep)
	assert.Contains(t, md, "**virtio-console transfer** (16 MiB of random bytes")
	assert.Contains(t, md, "| throughput, timed by the guest (MiB/s) | 5.00 (4.00–6.00) | 2.50 | 2.00 |")
	assert.Contains(t, md, "| throughput, begin → end marker arriving on the host side (MiB/s) | 4.00 (3.00–5.00) | 2.00 | 2.00 |")
	assert.Contains(t, md, "| runs with every byte checked (ok/attempted) | 3/3 | 1/2 | |")
	assert.Contains(t, md, "| KVM exits | 4000 (4000–4000) | 8000 | 0.50 |")
	assert.Contains(t, md, "| KVM io_exits | 100 (100–100) | 50 | 2.00 |")
	assert.NotContains(t, md, "KVM pf_taken", "no row for a counter nobody reported")
	assert.Contains(t, md, "Guest RAM (2M pages): hpcvmm: `--hugepages 2M`")
	assert.Contains(t, md, "prefault of the 512 MiB (2M pages")

	assert.NotContains(t, renderMarkdown(&Report{Config: Config{Where: whereL1}}), "virtio-console", "no section when the case did not run")
}

const smapsHugetlb = `7f0000000000-7f0020000000 rw-s 00000000 00:10 44 /memfd:hpcvmm-guest-ram (deleted)
Size:             524288 kB
Rss:                   0 kB
Shared_Hugetlb:   524288 kB
Private_Hugetlb:       0 kB
VmFlags: rd wr sh mr mw me ms de ht sd
`

func TestHugetlbCountsAsResident(t *testing.T) {
	rss, n, _, err := guestRSSFromSmaps(bufio.NewScanner(strings.NewReader(smapsHugetlb)), 512<<20)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Equal(t, uint64(524288), rss, "hugetlb pages are not in smaps' Rss")

	root := t.TempDir()
	dir := filepath.Join(root, "7")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "status"), []byte("VmHWM:\t 20000 kB\nVmRSS:\t 17000 kB\nHugetlbPages:\t  524288 kB\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "smaps"), []byte(smapsHugetlb), 0o644))
	mi, err := readMemInfo(root, 7, 512<<20)
	require.NoError(t, err)
	assert.Equal(t, memInfo{RSSKiB: 17000 + 524288, HWMKiB: 20000, HugetlbKiB: 524288, GuestRSSKiB: 524288, GuestMaps: 1}, mi)
	assert.Equal(t, uint64(17000), mi.RSSKiB-mi.GuestRSSKiB, "overhead: the VMM's own memory")
}

// qmpPeer answers QMP commands from a script of answer lines.
type qmpPeer struct {
	sent    []string
	answers *strings.Reader
}

func (q *qmpPeer) Write(p []byte) (int, error) {
	q.sent = append(q.sent, string(p))
	return len(p), nil
}
func (q *qmpPeer) Read(p []byte) (int, error) { return q.answers.Read(p) }

func TestQMPExchange(t *testing.T) {
	q := &qmpPeer{answers: strings.NewReader(`{"QMP": {"version": {}}}
{"return": {}}
{"event": "RESUME"}
{"return": {}}
`)}
	require.NoError(t, qmpExchange(q, []string{`{"execute":"qmp_capabilities"}`, `{"execute":"cont"}`}))
	assert.Equal(t, []string{"{\"execute\":\"qmp_capabilities\"}\n", "{\"execute\":\"cont\"}\n"}, q.sent)

	q = &qmpPeer{answers: strings.NewReader("{\"return\": {}}\n{\"error\": {\"class\": \"GenericError\", \"desc\": \"Bus 'vser0.0' not found\"}}\n")}
	err := qmpExchange(q, []string{"a", "b", "c"})
	assert.ErrorContains(t, err, "vser0.0")
	assert.Len(t, q.sent, 2, "nothing sent after an error")
	q = &qmpPeer{answers: strings.NewReader("")}
	assert.ErrorContains(t, qmpExchange(q, []string{"x"}), "no answer to x")
}
