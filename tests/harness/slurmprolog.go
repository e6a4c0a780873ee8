package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Where the slurm profile's L1 image holds the Prolog, the Epilog and the
// slurm.conf lines of docs/slurm.md; tests/l1/slurm-cluster.sh installs
// them as a site would.
const (
	l1SlurmProlog   = "/hpcvmm/slurm/prolog.sh"
	l1SlurmEpilog   = "/hpcvmm/slurm/epilog.sh"
	l1SlurmConfDocs = "/hpcvmm/slurm/slurm.conf.docs"
)

// slurmConfDocKeys are the slurm.conf settings of docs/slurm.md the L1
// cluster takes as documented: how and which Prolog and Epilog run, and
// the MEMLOCK limit steps get.
var slurmConfDocKeys = []string{"PrologFlags", "Prolog", "Epilog", "PropagateResourceLimitsExcept"}

// prologSubst are the only changes made to docs/slurm.md's Prolog for L1,
// each required to match exactly once (so a changed document fails the
// build instead of testing something else):
//   - L1's bridge is SlurmBridge, not the document's br0;
//   - L1's nic is the NVMe VF stand-in, not an InfiniBand VF: GUID options
//     on it are refused ("not InfiniBand"), as the document says they are;
//   - n1 and n2 are one host: a TAP name must differ per node, not only per
//     job (a multi-node job's two Prologs would otherwise make the same
//     TAP and the second fail).
var prologSubst = [][2]string{
	{"bridge=br0", "bridge=" + SlurmBridge},
	{"--vf slurm,guid=auto,link=enable", "--vf slurm"},
	{`hpvm$SLURM_JOB_ID`, `hpvm$SLURM_JOB_ID$SLURMD_NODENAME`},
}

// SlurmTAP is the TAP L1's Prolog makes for job on node (see prologSubst).
func SlurmTAP(job, node string) string { return "hpvm" + job + node }

// SlurmDocScripts reads docs/slurm.md (its text in doc) and returns what
// the slurm profile installs: the Prolog and the Epilog (the sh blocks whose
// first comment names /etc/slurm/prolog.d/hpcvmm.sh and
// /etc/slurm/epilog.d/hpcvmm.sh), the Prolog with prologSubst applied, and
// the slurm.conf lines of slurmConfDocKeys from the document's slurm.conf.
func SlurmDocScripts(doc string) (prolog, epilog, conf string, err error) {
	blocks := fencedBlocks(doc)
	for _, b := range blocks {
		switch {
		case b.lang == "sh" && strings.Contains(b.text, "# /etc/slurm/prolog.d/hpcvmm.sh"):
			if prolog != "" {
				return "", "", "", fmt.Errorf("docs/slurm.md: two Prolog blocks")
			}
			prolog = b.text
		case b.lang == "sh" && strings.Contains(b.text, "# /etc/slurm/epilog.d/hpcvmm.sh"):
			if epilog != "" {
				return "", "", "", fmt.Errorf("docs/slurm.md: two Epilog blocks")
			}
			epilog = b.text
		}
	}
	if prolog == "" || epilog == "" {
		return "", "", "", fmt.Errorf("docs/slurm.md: no sh block for the Prolog (%v) or the Epilog (%v)", prolog != "", epilog != "")
	}
	for _, s := range prologSubst {
		if n := strings.Count(prolog, s[0]); n != 1 {
			return "", "", "", fmt.Errorf("docs/slurm.md's Prolog holds %q %d times, the slurm profile replaces it once: update prologSubst", s[0], n)
		}
		prolog = strings.Replace(prolog, s[0], s[1], 1)
	}
	var lines []string
	for _, b := range blocks {
		if b.lang != "" || !strings.Contains(b.text, "SelectType=") {
			continue
		}
		for _, l := range strings.Split(b.text, "\n") {
			k, _, ok := strings.Cut(l, "=")
			for _, want := range slurmConfDocKeys {
				if ok && k == want {
					lines = append(lines, l)
				}
			}
		}
	}
	if len(lines) != len(slurmConfDocKeys) {
		return "", "", "", fmt.Errorf("docs/slurm.md's slurm.conf: found %q, want one line each of %v", lines, slurmConfDocKeys)
	}
	return prolog, epilog, strings.Join(lines, "\n") + "\n", nil
}

// fencedBlock is one ``` block of a Markdown document.
type fencedBlock struct{ lang, text string }

// fencedBlocks returns doc's fenced code blocks in order.
func fencedBlocks(doc string) []fencedBlock {
	var out []fencedBlock
	var cur *fencedBlock
	var body []string
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(l, "```") {
			if cur != nil {
				body = append(body, l)
			}
			continue
		}
		if cur == nil {
			cur = &fencedBlock{lang: strings.TrimSpace(strings.TrimPrefix(l, "```"))}
			body = nil
			continue
		}
		cur.text = strings.Join(body, "\n") + "\n"
		out = append(out, *cur)
		cur = nil
	}
	return out
}

// addSlurmDocScripts packs SlurmDocScripts of the module's docs/slurm.md
// into im.
func addSlurmDocScripts(im *Image, root string) error {
	doc, err := os.ReadFile(filepath.Join(root, "docs", "slurm.md"))
	if err != nil {
		return err
	}
	prolog, epilog, conf, err := SlurmDocScripts(string(doc))
	if err != nil {
		return err
	}
	im.AddBytes(l1SlurmProlog, []byte(prolog), 0o755)
	im.AddBytes(l1SlurmEpilog, []byte(epilog), 0o755)
	im.AddBytes(l1SlurmConfDocs, []byte(conf), 0o644)
	return nil
}
