package ibvf

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/hpcvmm/hpcvmm/host"
)

// GUID is a 64-bit InfiniBand GUID (EUI-64).
type GUID uint64

// ParseGUID reads a GUID as eight colon-separated hex bytes
// ("02:1a:2b:3c:4d:5e:6f:70", as ip link shows them), or 16 hex digits with
// an optional 0x. Zero and all-ones are refused: a zero port GUID keeps
// the link down, and all-ones is no valid GUID.
func ParseGUID(s string) (GUID, error) {
	var v uint64
	var err error
	if strings.Contains(s, ":") {
		parts := strings.Split(s, ":")
		if len(parts) != 8 {
			return 0, fmt.Errorf("GUID %q: want 8 colon-separated hex bytes, e.g. 02:00:00:00:00:00:00:01", s)
		}
		for _, p := range parts {
			b, perr := strconv.ParseUint(p, 16, 8)
			if perr != nil || len(p) == 0 || len(p) > 2 {
				return 0, fmt.Errorf("GUID %q: %q is not a hex byte", s, p)
			}
			v = v<<8 | b
		}
	} else {
		h := strings.TrimPrefix(strings.TrimPrefix(s, "0x"), "0X")
		if len(h) != 16 {
			return 0, fmt.Errorf("GUID %q: want 8 colon-separated hex bytes or 16 hex digits", s)
		}
		if v, err = strconv.ParseUint(h, 16, 64); err != nil {
			return 0, fmt.Errorf("GUID %q: not hexadecimal", s)
		}
	}
	if v == 0 || v == ^uint64(0) {
		return 0, fmt.Errorf("GUID %q: zero and ff:ff:ff:ff:ff:ff:ff:ff are not usable GUIDs (a zero port GUID keeps the link down)", s)
	}
	return GUID(v), nil
}

// String formats the GUID as ip link does: 8 colon-separated hex bytes.
func (g GUID) String() string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(g))
	return net.HardwareAddr(b[:]).String()
}

// MarshalText makes journals and JSON show the colon form.
func (g GUID) MarshalText() ([]byte, error) { return []byte(g.String()), nil }

// UnmarshalText reads the colon form; zero is allowed here, since a
// journal records a VF's original zero GUIDs.
func (g *GUID) UnmarshalText(b []byte) error {
	if string(b) == GUID(0).String() {
		*g = 0
		return nil
	}
	v, err := ParseGUID(string(b))
	*g = v
	return err
}

// Seed is what makes derived GUIDs unique in the cluster: at one time, a
// (cluster, job, node) names at most one VM.
type Seed struct {
	// Cluster is SLURM_CLUSTER_NAME ("" outside Slurm, or when a site runs
	// one cluster per fabric).
	Cluster string
	// Job is SLURM_JOB_ID.
	Job string
	// Node is the Slurm node name.
	Node string
}

// Valid says what is missing for Derive.
func (s Seed) Valid() error {
	if s.Job == "" || s.Node == "" {
		return fmt.Errorf("guid=auto derives GUIDs from the Slurm job ID and node name, and they are unknown here (SLURM_JOB_ID=%q, node %q): run under srun/sbatch or in the Prolog, or give node-guid= and port-guid=", s.Job, s.Node)
	}
	return nil
}

// Derive returns the node and port GUIDs of VF vf for seed (see the
// package documentation for the construction).
func Derive(seed Seed, vf host.BDF) (node, port GUID) {
	return derive(seed, vf, "node"), derive(seed, vf, "port")
}

func derive(seed Seed, vf host.BDF, role string) GUID {
	h := sha256.New()
	for _, s := range []string{"hpcvmm-ib-guid-v1", seed.Cluster, seed.Job, seed.Node, vf.String(), role} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	sum := h.Sum(nil)
	sum[0] = sum[0]&^0x01 | 0x02 // EUI-64: individual (not group), locally administered
	return GUID(binary.BigEndian.Uint64(sum[:8]))
}
