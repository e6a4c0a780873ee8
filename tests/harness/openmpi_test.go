package harness

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestParseAptDepends: apt-cache depends output as Debian 12's apt prints
// it (openmpi-bin's and libpam-modules' stanzas), plus a virtual package
// nothing provides: one real package per dependency, the first
// alternative of an "a | b" group, a virtual one's first provider.
func TestParseAptDepends(t *testing.T) {
	out := `openmpi-bin
  Depends: libc6
  Depends: libopenmpi3
 |Depends: openssh-client
  Depends: <ssh-client>
    openssh-client
libpam-modules
  PreDepends: libaudit1
 |PreDepends: <debconf-2.0>
    cdebconf
    debconf
  PreDepends: debconf
  PreDepends: libpam-modules-bin
  Suggests: unrelated
busybox-static
  Depends: <nothing-provides-this>
 |Depends: <none-either>
  Depends: fallback
`
	assert.Equal(t, map[string][]string{
		"openmpi-bin":    {"libc6", "libopenmpi3", "openssh-client"},
		"libpam-modules": {"libaudit1", "cdebconf", "libpam-modules-bin"},
		"busybox-static": {"fallback"},
	}, parseAptDepends(out))
	assert.Equal(t, map[string][]string{"libc6": nil}, parseAptDepends("libc6\n"), "a package without dependencies is listed")
	assert.Empty(t, parseAptDepends(""))
}
