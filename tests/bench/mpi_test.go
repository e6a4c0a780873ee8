package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/tests/harness"
)

func TestParseMPIPingPong(t *testing.T) {
	m, err := parseMPIPingPong("srun: some noise\n  pingpong lat_us=42.5 bw_mib_s=1234.0  \nrank=0 size=2\n")
	require.NoError(t, err)
	assert.Equal(t, map[string]float64{mMPILatUs: 42.5, mMPIBwMiB: 1234}, m)

	for name, in := range map[string]string{
		"no line":          "rank=0 size=2 host=n1 sum=1 token=2\n",
		"empty":            "",
		"no bandwidth":     "pingpong lat_us=3.0\n",
		"zero latency":     "pingpong lat_us=0.0 bw_mib_s=10.0\n",
		"negative":         "pingpong lat_us=-1 bw_mib_s=10.0\n",
		"NaN":              "pingpong lat_us=NaN bw_mib_s=10.0\n",
		"infinite":         "pingpong lat_us=3 bw_mib_s=+Inf\n",
		"not a number":     "pingpong lat_us=fast bw_mib_s=10.0\n",
		"not KEY=VALUE":    "pingpong lat_us 3 bw_mib_s=10.0\n",
		"cut before value": "pingpong lat_us=3 bw_mib_s=\n",
	} {
		_, err := parseMPIPingPong(in)
		assert.Error(t, err, name)
	}
}

func TestMPISrunArgs(t *testing.T) {
	cfg := Config{HPCVMM: "/hpcvmm/bin/hpcvmm", Kernel: "/hpcvmm/l2/vmlinuz"}
	vm := strings.Join(mpiSrunArgs(cfg, vmmMPIVMs), " ")
	assert.True(t, strings.HasPrefix(vm, "--mpi=pmi2 -N2 --ntasks-per-node=1 "), vm)
	assert.Contains(t, vm, " /hpcvmm/bin/hpcvmm run --kernel /hpcvmm/l2/vmlinuz ")
	assert.Contains(t, vm, "--rootfs "+harness.MPIRoot+" --net tap=hpvbench+rank,bridge="+harness.SlurmBridge+",ip=10.78.0.40/24+rank -- /mpi_app pingpong")
	n := strings.Join(mpiSrunArgs(cfg, vmmMPINative), " ")
	assert.True(t, strings.HasSuffix(n, "--export=ALL,LD_LIBRARY_PATH="+harness.MPILibraryPath+" "+harness.MPIRoot+"/mpi_app pingpong"), n)
	assert.NotContains(t, n, " run --kernel", "no VMM in the control")
	tcp := strings.Join(mpiSrunArgs(cfg, vmmMPINativeTCP), " ")
	assert.Contains(t, tcp, ",UCX_TLS=tcp,self "+harness.MPIRoot+"/mpi_app pingpong", tcp)
}

func TestMPICaseFlags(t *testing.T) {
	o, err := parseFlags([]string{"-cases", "mpi"})
	require.NoError(t, err)
	assert.Equal(t, []string{caseMPI}, o.cases)
	assert.True(t, wantsMPI(o.cases))
	assert.False(t, wantsMPI(nil), "all cases (the default) leave mpi out: it needs an L1 of its own")
	assert.True(t, Config{}.wants(caseLaunch))
}

func TestRenderMPI(t *testing.T) {
	var samples []Sample
	for rep := 1; rep <= 3; rep++ {
		v := newSample(caseMPI, vmmMPIVMs, whereL1, rep)
		v.Metrics = map[string]float64{mMPILatUs: 300 + float64(rep), mMPIBwMiB: 50, mMPISrun: 40000}
		n := newSample(caseMPI, vmmMPINative, whereL1, rep)
		n.Metrics = map[string]float64{mMPILatUs: 100, mMPIBwMiB: 200, mMPISrun: 4000}
		tcp := newSample(caseMPI, vmmMPINativeTCP, whereL1, rep)
		tcp.Metrics = map[string]float64{mMPILatUs: 150, mMPIBwMiB: 100, mMPISrun: 4000}
		samples = append(samples, v, n, tcp)
	}
	f := newSample(caseMPI, vmmMPIVMs, whereL1, 4)
	f.Err = "srun: exit status 1"
	samples = append(samples, f)
	rep := &Report{Config: Config{Cases: []string{caseMPI}, Where: whereL1}, Samples: samples}
	md := renderMarkdown(rep)
	assert.Contains(t, md, "MPI across VMs (issue 25)")
	assert.Contains(t, md, "| latency (µs per 1-byte round trip) | 302.0 (301.0–303.0)")
	assert.Contains(t, md, "| 100.0 (100.0–100.0) | 150.0 (150.0–150.0) | 3.02 | 2.01 |")
	assert.Contains(t, md, "| bandwidth (MiB/s, 1 MiB messages) | 50.0 (50.0–50.0)")
	assert.Contains(t, md, "| 200.0 (200.0–200.0) | 100.0 (100.0–100.0) | 0.25 | 0.50 |")
	assert.NotContains(t, md, "Launch → guest /init marker", "an mpi-only run shows only its table")
}
