package asuser

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// nobody is an unprivileged identity for the tests (they need root to take
// it, as hpcvmm does when it acts for a job's user).
var nobody = &User{UID: 65534, GID: 65534, Name: "nobody"}

func TestOpenTakesTheUsersRights(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("taking another user's file-system identity needs root (as hpcvmm does for a Slurm job's user)")
	}
	dir := t.TempDir()
	// t.TempDir's parent is 0700: open the way for nobody.
	require.NoError(t, os.Chmod(filepath.Dir(dir), 0o755))
	require.NoError(t, os.Chmod(dir, 0o755))
	secret := filepath.Join(dir, "secret")
	require.NoError(t, os.WriteFile(secret, []byte("root only\n"), 0o600))
	public := filepath.Join(dir, "public")
	require.NoError(t, os.WriteFile(public, []byte("anyone\n"), 0o644))

	_, err := ReadFile(nobody, secret)
	assert.ErrorIs(t, err, os.ErrPermission, "a 0600 root file read as nobody")
	b, err := ReadFile(nobody, public)
	require.NoError(t, err)
	assert.Equal(t, "anyone\n", string(b))
	// The process keeps root's rights: only the open took nobody's.
	b, err = ReadFile(nil, secret)
	require.NoError(t, err)
	assert.Equal(t, "root only\n", string(b))

	// A file created as the user is the user's.
	out := filepath.Join(dir, "out")
	require.NoError(t, os.Chmod(dir, 0o777))
	f, err := OpenFile(nobody, out, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o644)
	require.NoError(t, err)
	fi, err := f.Stat()
	require.NoError(t, err)
	f.Close()
	assert.Equal(t, uint32(65534), statUID(fi))
}

// Every thread keeps root's identity: many opens as nobody on many
// goroutines, then root's read of the secret on each of them must work.
func TestIdentityNeverLeaksToOtherThreads(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	require.NoError(t, os.WriteFile(secret, []byte("x"), 0o600))
	done := make(chan error, 64)
	for range 32 {
		go func() { _, err := ReadFile(nobody, secret); done <- err }()
		go func() { _, err := os.ReadFile(secret); done <- err }()
	}
	denied, allowed := 0, 0
	for range 64 {
		if err := <-done; err != nil {
			denied++
		} else {
			allowed++
		}
	}
	assert.Equal(t, 32, denied, "each read as nobody is refused")
	assert.Equal(t, 32, allowed, "each read as root works: no thread kept nobody's identity")
}

func TestActing(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	if os.Geteuid() != 0 {
		u, err := Acting(env(map[string]string{JobUIDVar: "0"}))
		require.NoError(t, err)
		assert.Nil(t, u, "a user's own hpcvmm acts for itself, whatever SLURM_JOB_UID says")
		return
	}
	u, err := Acting(env(nil))
	require.NoError(t, err)
	assert.Nil(t, u, "root without a job acts for itself")
	u, err = Acting(env(map[string]string{JobUIDVar: "0"}))
	require.NoError(t, err)
	assert.Nil(t, u, "root for root's own job")
	_, err = Acting(env(map[string]string{JobUIDVar: "x1"}))
	assert.ErrorContains(t, err, `SLURM_JOB_UID="x1"`)
	u, err = Acting(env(map[string]string{JobUIDVar: "65534"}))
	if err == nil {
		assert.Equal(t, uint32(65534), u.UID)
	} else {
		assert.ErrorContains(t, err, "uid 65534", "a user the system does not know is an error, never root's rights")
	}
}
