package cachedir

import (
	"os"
	"os/user"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestDefault(t *testing.T) {
	for _, tc := range []struct {
		name string
		euid int
		env  map[string]string
		kind string
		want string
	}{
		{"root", 0, nil, Kernels, "/var/cache/hpcvmm/kernels"},
		{"root initramfs", 0, nil, Initramfs, "/var/cache/hpcvmm/initramfs"},
		{"root for a job's user", 0, map[string]string{"SLURM_JOB_UID": "0"}, Initramfs, "/var/cache/hpcvmm/initramfs"},
		{"XDG", 1000, map[string]string{"XDG_CACHE_HOME": "/x/cache/", "HOME": "/home/u"}, Initramfs, "/x/cache/hpcvmm/initramfs"},
		{"relative XDG ignored", 1000, map[string]string{"XDG_CACHE_HOME": "cache", "HOME": "/home/u"}, Kernels, "/home/u/.cache/hpcvmm/kernels"},
		{"HOME", 1000, map[string]string{"HOME": "/home/u"}, Initramfs, "/home/u/.cache/hpcvmm/initramfs"},
		{"images", 1000, map[string]string{"HOME": "/home/u"}, Images, "/home/u/.cache/hpcvmm/images"},
		{"root images", 0, nil, Images, "/var/cache/hpcvmm/images"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := defaultFor(tc.kind, tc.euid, env(tc.env))
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	_, err := defaultFor("modules", 0, env(nil))
	require.ErrorContains(t, err, `unknown cache kind "modules"`)
}

// Root acting for a job's user keeps that user's entries apart: a lookup
// for one user never reads the directory another user's job filled.
func TestDefaultRootActingForAUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("asuser.Acting reads the process's own euid: it acts for a job's user only as root")
	}
	if _, err := user.LookupId("65534"); err != nil {
		t.Skip("no user 65534 in the user database")
	}
	got, err := defaultFor(Initramfs, 0, env(map[string]string{"SLURM_JOB_UID": "65534"}))
	require.NoError(t, err)
	assert.Equal(t, "/var/cache/hpcvmm/users/65534/initramfs", got)
	_, err = defaultFor(Initramfs, 0, env(map[string]string{"SLURM_JOB_UID": "x"}))
	require.ErrorContains(t, err, "SLURM_JOB_UID")
}

// Without $HOME, the home directory comes from the user database.
func TestDefaultFromPasswd(t *testing.T) {
	uid := os.Geteuid()
	u, err := user.LookupId(strconv.Itoa(uid))
	if err != nil || u.HomeDir == "" {
		t.Skipf("uid %d has no home directory in the user database", uid)
	}
	if uid == 0 {
		uid = 65534 // root's own default is /var/cache/hpcvmm; look up another user
		if u, err = user.LookupId("65534"); err != nil {
			t.Skip("no user 65534 in the user database")
		}
	}
	got, err := defaultFor(Kernels, uid, env(nil))
	require.NoError(t, err)
	assert.Equal(t, u.HomeDir+"/.cache/hpcvmm/kernels", got)
}
