package ibvf

import (
	"fmt"
	"strings"

	"github.com/hpcvmm/hpcvmm/host"
)

// LinkState is a VF's administrative link state (IFLA_VF_LINK_STATE_*).
type LinkState uint32

// The link states, as the kernel numbers them.
const (
	LinkAuto    LinkState = 0 // follow the PF's port (the driver's default)
	LinkEnable  LinkState = 1 // up whatever the PF's port does
	LinkDisable LinkState = 2 // down
)

func (s LinkState) String() string {
	switch s {
	case LinkAuto:
		return "auto"
	case LinkEnable:
		return "enable"
	case LinkDisable:
		return "disable"
	}
	return fmt.Sprintf("link-state-%d", uint32(s))
}

// ParseLinkState reads auto, enable or disable.
func ParseLinkState(s string) (LinkState, error) {
	for _, l := range []LinkState{LinkAuto, LinkEnable, LinkDisable} {
		if s == l.String() {
			return l, nil
		}
	}
	return 0, fmt.Errorf("link=%s: want auto, enable or disable", s)
}

// Settings are the identity options of one --vf: what to set, and what to
// leave alone.
type Settings struct {
	// NodeGUID and PortGUID are set when non-zero.
	NodeGUID, PortGUID GUID
	// Auto derives both GUIDs from a Seed (guid=auto); Resolve fills them.
	Auto bool
	// Link is set when SetLink.
	Link    LinkState
	SetLink bool
}

// Keys are the --vf option keys Settings takes.
var Keys = []string{"node-guid", "port-guid", "guid", "link"}

// Set parses one key=value option of --vf. It reports false for a key that
// is not an identity option.
func (s *Settings) Set(key, value string) (bool, error) {
	var err error
	switch key {
	case "node-guid":
		if s.NodeGUID != 0 {
			return true, fmt.Errorf("node-guid given twice")
		}
		s.NodeGUID, err = ParseGUID(value)
	case "port-guid":
		if s.PortGUID != 0 {
			return true, fmt.Errorf("port-guid given twice")
		}
		s.PortGUID, err = ParseGUID(value)
	case "guid":
		if value != "auto" {
			return true, fmt.Errorf("guid=%s: the only value is auto (GUIDs derived from the Slurm job, node and VF); give explicit ones with node-guid= and port-guid=", value)
		}
		s.Auto = true
	case "link":
		if s.SetLink {
			return true, fmt.Errorf("link given twice")
		}
		s.Link, err = ParseLinkState(value)
		s.SetLink = true
	default:
		return false, nil
	}
	if err == nil && s.Auto && (s.NodeGUID != 0 || s.PortGUID != 0) {
		err = fmt.Errorf("guid=auto and node-guid/port-guid exclude each other")
	}
	return true, err
}

// Empty reports whether nothing is to be set: the VF is passed through
// with the identity it has.
func (s Settings) Empty() bool {
	return s.NodeGUID == 0 && s.PortGUID == 0 && !s.Auto && !s.SetLink
}

// Resolve fills the GUIDs of guid=auto from seed for VF vf.
func (s *Settings) Resolve(seed Seed, vf host.BDF) error {
	if !s.Auto {
		return nil
	}
	if err := seed.Valid(); err != nil {
		return err
	}
	s.NodeGUID, s.PortGUID = Derive(seed, vf)
	s.Auto = false
	return nil
}

// String is the settings as --vf options, for logs.
func (s Settings) String() string {
	var parts []string
	if s.Auto {
		parts = append(parts, "guid=auto")
	}
	if s.NodeGUID != 0 {
		parts = append(parts, "node-guid="+s.NodeGUID.String())
	}
	if s.PortGUID != 0 {
		parts = append(parts, "port-guid="+s.PortGUID.String())
	}
	if s.SetLink {
		parts = append(parts, "link="+s.Link.String())
	}
	return strings.Join(parts, ",")
}
