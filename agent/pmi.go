package agent

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"

	"github.com/hpcvmm/hpcvmm/jobproto"
	"github.com/hpcvmm/hpcvmm/pmi"
)

// attachPMI gives cmd a PMI socket of its own (Start.PMI: hpcvmm relays
// the Slurm task's PMI socket on two ports): one end of a socket pair as
// its next inherited descriptor, named in PMI_FD, the other end relayed to
// the ports once COMMAND runs (startPMI). The other PMI_* variables came
// from the host in Start.Env.
func (a *Agent) attachPMI(cmd *exec.Cmd) (*pmi.Guest, *jobproto.Failed) {
	if a.OpenPMI == nil {
		return nil, &jobproto.Failed{Kind: jobproto.FailAgent, Reason: "the job asks for PMI but this agent has no PMI ports"}
	}
	g, err := pmi.NewGuest()
	if err != nil {
		return nil, &jobproto.Failed{Kind: jobproto.FailAgent, Reason: err.Error()}
	}
	cmd.ExtraFiles = append(cmd.ExtraFiles, g.Child)
	// ExtraFiles[i] is descriptor 3+i in the child.
	cmd.Env = append(cmd.Env, pmi.FDVar+"="+strconv.Itoa(2+len(cmd.ExtraFiles)))
	return g, nil
}

// startPMI relays the PMI socket's agent end to the ports. It returns at
// once: the relay ends on its own when both sides have ended, and the
// agent does not wait for it (srun may keep its side open until the task,
// hpcvmm, exits).
func (a *Agent) startPMI(g *pmi.Guest) {
	g.Child.Close() // COMMAND has its copy
	in, out, err := a.OpenPMI()
	if err != nil {
		a.Logf("PMI: %v", err)
		return
	}
	go func() {
		if err := g.Relay(in, out); err != nil {
			a.Logf("PMI relay: %v", err)
		}
	}()
}

// openPMIPorts finds and opens the two PMI ports (as PID 1).
func openPMIPorts() (io.Reader, io.WriteCloser, error) {
	ports, err := FindPorts("/sys", "/dev", []string{pmi.PortIn, pmi.PortOut}, portTimeout)
	if err != nil {
		return nil, nil, fmt.Errorf("finding the PMI ports: %w", err)
	}
	in, err := os.OpenFile(ports[pmi.PortIn], os.O_RDONLY, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("opening %s: %w", pmi.PortIn, err)
	}
	out, err := os.OpenFile(ports[pmi.PortOut], os.O_WRONLY, 0)
	if err != nil {
		in.Close()
		return nil, nil, fmt.Errorf("opening %s: %w", pmi.PortOut, err)
	}
	return in, out, nil
}
