package agent

import (
	"errors"

	"github.com/hpcvmm/hpcvmm/jobproto"
)

// configureNetwork sets up the spec's interfaces and name servers.
func configureNetwork(s *jobproto.Start) error {
	return errors.New("--net with ip=/dhcp: this agent cannot configure guest networking yet")
}
