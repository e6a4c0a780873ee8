package agent

import (
	"fmt"

	"github.com/hpcvmm/hpcvmm/guestnet"
	"github.com/hpcvmm/hpcvmm/jobproto"
)

// configureNetwork sets up the spec's interfaces (found by MAC: the host
// chose the virtio-net devices' addresses) and name servers, with package
// guestnet. A DHCP lease is renewed for as long as the agent lives.
func configureNetwork(s *jobproto.Start) error {
	ifs := make([]guestnet.Interface, len(s.Interfaces))
	for i, it := range s.Interfaces {
		ifs[i] = guestnet.Interface{MAC: it.MAC, Address: it.Address, Gateway: it.Gateway, DHCP: it.DHCP}
	}
	dns := make([]string, len(s.DNS))
	for i, ip := range s.DNS {
		dns[i] = ip.String()
	}
	if err := guestnet.Configure(ifs, dns); err != nil {
		return fmt.Errorf("configuring the guest network: %w", err)
	}
	return nil
}
