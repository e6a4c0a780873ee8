package hoststate

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/ibvf"
)

// fakePF is a PF's netdev as netlink shows it: per-VF identities, every
// message recorded, and an optional failure on the n-th set.
type fakePF struct {
	vfs    map[int]ibvf.Identity
	log    []string
	failAt int // 1-based index of the set message that fails; 0 none
	sets   int
}

func (f *fakePF) Identity(netdev string, vf int) (ibvf.Identity, error) {
	id, ok := f.vfs[vf]
	if !ok {
		return id, errors.New("no such VF")
	}
	return id, nil
}

func (f *fakePF) set(what string, netdev string, vf int, apply func(*ibvf.Identity)) error {
	f.sets++
	f.log = append(f.log, fmt.Sprintf("%s %s vf %d", what, netdev, vf))
	if f.sets == f.failAt {
		return errors.New("EIO")
	}
	id := f.vfs[vf]
	apply(&id)
	f.vfs[vf] = id
	return nil
}

func (f *fakePF) SetNodeGUID(n string, vf int, g ibvf.GUID) error {
	return f.set("node="+g.String(), n, vf, func(id *ibvf.Identity) { id.NodeGUID = g })
}
func (f *fakePF) SetPortGUID(n string, vf int, g ibvf.GUID) error {
	return f.set("port="+g.String(), n, vf, func(id *ibvf.Identity) { id.PortGUID = g })
}
func (f *fakePF) SetLinkState(n string, vf int, s ibvf.LinkState) error {
	return f.set("link="+s.String(), n, vf, func(id *ibvf.Identity) { id.Link = s })
}

func ibTarget() ibvf.Target {
	return ibvf.Target{VF: host.BDF{Bus: 0x41, Function: 3}, PF: host.BDF{Bus: 0x41}, Netdev: "ib0", Index: 2}
}

func TestSetVFIdentityJournaledAndRestored(t *testing.T) {
	state := t.TempDir()
	pf := &fakePF{vfs: map[int]ibvf.Identity{2: {Link: ibvf.LinkAuto}}}
	j := Open(Options{StateDir: state, SysfsRoot: t.TempDir(), Netlink: pf, PID: 4242})
	s := ibvf.Settings{NodeGUID: 0x0211, PortGUID: 0x0222, Link: ibvf.LinkEnable, SetLink: true}
	require.NoError(t, j.SetVFIdentity(ibTarget(), s))
	assert.Equal(t, ibvf.Identity{NodeGUID: 0x0211, PortGUID: 0x0222, Link: ibvf.LinkEnable}, pf.vfs[2])
	assert.Equal(t, []string{"port=00:00:00:00:00:00:02:22 ib0 vf 2", "node=00:00:00:00:00:00:02:11 ib0 vf 2", "link=enable ib0 vf 2"}, pf.log,
		"one message per attribute, port GUID first")

	// The journal on disk has the original values, so a crash is undone by
	// RestoreStale (hpcvmm unbind) from another process.
	b, err := os.ReadFile(j.Path())
	require.NoError(t, err)
	assert.Contains(t, string(b), `"original_port_guid": "00:00:00:00:00:00:00:00"`)
	rep, err := RestoreStale(Options{StateDir: state, SysfsRoot: t.TempDir(), Netlink: pf, PID: 1})
	require.NoError(t, err)
	require.Len(t, rep.Restored, 1)
	assert.Equal(t, KindIBVF, rep.Restored[0].Kind)
	assert.Equal(t, ibvf.Identity{Link: ibvf.LinkAuto}, pf.vfs[2], "zero GUIDs and auto link back")
	_, err = os.Stat(j.Path())
	assert.True(t, os.IsNotExist(err), "journal removed once everything is undone")
}

func TestSetVFIdentityOnlyTouchesWhatItSets(t *testing.T) {
	pf := &fakePF{vfs: map[int]ibvf.Identity{2: {NodeGUID: 0x0299, PortGUID: 0x0298, Link: ibvf.LinkDisable}}}
	j := Open(Options{StateDir: t.TempDir(), SysfsRoot: t.TempDir(), Netlink: pf, PID: 5})
	require.NoError(t, j.SetVFIdentity(ibTarget(), ibvf.Settings{Link: ibvf.LinkEnable, SetLink: true}))
	require.NoError(t, j.Restore())
	assert.Equal(t, []string{"link=enable ib0 vf 2", "link=disable ib0 vf 2"}, pf.log)
	assert.Equal(t, ibvf.Identity{NodeGUID: 0x0299, PortGUID: 0x0298, Link: ibvf.LinkDisable}, pf.vfs[2])
}

func TestSetVFIdentityFailureRestoresAtOnce(t *testing.T) {
	state := t.TempDir()
	pf := &fakePF{vfs: map[int]ibvf.Identity{2: {}}, failAt: 2}
	j := Open(Options{StateDir: state, SysfsRoot: t.TempDir(), Netlink: pf, PID: 6})
	err := j.SetVFIdentity(ibTarget(), ibvf.Settings{NodeGUID: 0x0211, PortGUID: 0x0222})
	require.ErrorContains(t, err, "EIO")
	assert.Equal(t, ibvf.Identity{}, pf.vfs[2], "the port GUID set before the failure is put back")
	assert.Empty(t, j.Changes())
	_, err = os.Stat(filepath.Join(state, "6.json"))
	assert.True(t, os.IsNotExist(err))

	// A VF the PF does not report: nothing journaled, nothing sent.
	pf2 := &fakePF{vfs: map[int]ibvf.Identity{}}
	j2 := Open(Options{StateDir: state, SysfsRoot: t.TempDir(), Netlink: pf2, PID: 7})
	err = j2.SetVFIdentity(ibTarget(), ibvf.Settings{NodeGUID: 1, PortGUID: 2})
	require.ErrorContains(t, err, "nothing changed")
	assert.Empty(t, pf2.log)
	assert.ErrorContains(t, j2.SetVFIdentity(ibTarget(), ibvf.Settings{Auto: true}), "guid=auto not resolved")
}
