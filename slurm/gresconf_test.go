package slurm

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A gres.conf as a site with GPU and VF nodes writes it: global settings,
// comments, ranges, lists, node-specific lines, a continued line.
const siteGresConf = `# GPUs are bound to vfio-pci, so AutoDetect cannot see them.
AutoDetect=off
Name=gpu Type=h100 File=/dev/vfio/[12-15]   # four GPUs, indices 0-3
NodeName=n[1-2] Name=nic File=/dev/vfio/40,/dev/vfio/41
NodeName=n3 Name=nic File=/dev/vfio/[50-51]
name=GPU file=/dev/vfio/99 nodename=other   # another node's line, keys in lower case
NodeName=n1 Name=gpu \
    File=/dev/vfio/20
Name=mps Count=100
`

func TestParseGresConfNodeLines(t *testing.T) {
	gc, err := ParseGresConf("gres.conf", strings.NewReader(siteGresConf), "n1")
	require.NoError(t, err)
	var got []string
	for _, d := range gc.Devices {
		got = append(got, d.Name+":"+d.File)
	}
	assert.Equal(t, []string{
		"gpu:/dev/vfio/12", "gpu:/dev/vfio/13", "gpu:/dev/vfio/14", "gpu:/dev/vfio/15",
		"nic:/dev/vfio/40", "nic:/dev/vfio/41",
		"gpu:/dev/vfio/20",
	}, got)
	// Indices count per name, in file order; the continued line is the
	// fifth gpu and keeps the line number it started on.
	assert.Equal(t, 4, gc.Devices[6].Index)
	assert.Equal(t, 7, gc.Devices[6].Line)
	assert.Equal(t, 1, gc.Devices[5].Index)
	assert.Equal(t, 41, gc.Devices[5].DevNum)
	assert.Equal(t, "h100", gc.Devices[0].Type)
	assert.Equal(t, []CountOnly{{Name: "mps", Count: 100, Line: 9}}, gc.Counted)

	gc3, err := ParseGresConf("gres.conf", strings.NewReader(siteGresConf), "n3")
	require.NoError(t, err)
	var files []string
	for _, d := range gc3.Devices {
		files = append(files, d.File)
	}
	assert.Equal(t, []string{"/dev/vfio/12", "/dev/vfio/13", "/dev/vfio/14", "/dev/vfio/15", "/dev/vfio/50", "/dev/vfio/51"}, files)
}

func TestParseGresConfErrors(t *testing.T) {
	for _, tc := range []struct{ conf, want string }{
		{"Name=gpu File=/dev/vfio/[12-", "line 1: file /dev/vfio/[12- (File=)"},
		{"Name=gpu File=/dev/vfio/[3-1]", "want numbers and ranges"},
		{"Name=gpu Count=3 File=/dev/vfio/[1-2]", "Count=3 but File=/dev/vfio/[1-2] names 2 files"},
		{"\n\nName=gpu gpu", `line 3: "gpu": want Key=Value`},
		{"Include /etc/slurm/gres.d/x.conf", "Include is not supported"},
		{"Name=gpu Name=nic File=/dev/vfio/1", "name= given twice"},
		{"Name=gpu MultipleFiles=/dev/vfio/[1-2]", "MultipleFiles"},
		{"Name=gpu File=/dev/vfio/[0-99999999]", "more than 65536"},
		{"Name=gpu Count=x", "count=x (Count=)"},
	} {
		_, err := ParseGresConf("gres.conf", strings.NewReader(tc.conf), "n1")
		require.Error(t, err, tc.conf)
		assert.Contains(t, err.Error(), tc.want, tc.conf)
	}
}

func TestExpandHostlist(t *testing.T) {
	for in, want := range map[string][]string{
		"n1":                {"n1"},
		"n[1-3]":            {"n1", "n2", "n3"},
		"n[01-03,10]":       {"n01", "n02", "n03", "n10"},
		"a[1-2]b[1-2]":      {"a1b1", "a1b2", "a2b1", "a2b2"},
		"x,y[7,9],z":        {"x", "y7", "y9", "z"},
		"/dev/vfio/[12-15]": {"/dev/vfio/12", "/dev/vfio/13", "/dev/vfio/14", "/dev/vfio/15"},
	} {
		got, err := ExpandHostlist(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"n[1-", "n]", "n[a-b]", "n[[1]]", "a,,b", "n[-1]"} {
		_, err := ExpandHostlist(bad)
		assert.Error(t, err, bad)
	}
}

func TestParseIndexList(t *testing.T) {
	got, err := ParseIndexList("0,2-4,7")
	require.NoError(t, err)
	assert.Equal(t, []int{0, 2, 3, 4, 7}, got)
	for _, bad := range []string{"", "a", "3-1", "1,,2", "-1"} {
		_, err := ParseIndexList(bad)
		assert.Error(t, err, bad)
	}
}

func TestTrailingNumber(t *testing.T) {
	assert.Equal(t, 40, trailingNumber("/dev/vfio/40"))
	assert.Equal(t, 0, trailingNumber("/dev/nvidia0"))
	assert.Equal(t, -1, trailingNumber("/dev/vfio/vfio"))
}

// FuzzParseGresConf: whatever a site writes, parsing returns an error or
// devices, never a panic, and never more devices than the expansion limit.
func FuzzParseGresConf(f *testing.F) {
	f.Add(siteGresConf)
	f.Add("Name=gpu File=/dev/vfio/[1-2,5]\nNodeName=n[1-3] Name=nic File=/dev/vfio/7")
	f.Fuzz(func(t *testing.T, s string) {
		gc, err := ParseGresConf("f", strings.NewReader(s), "n1")
		if err == nil && len(gc.Devices) > 64*maxExpand {
			t.Fatalf("%d devices", len(gc.Devices))
		}
	})
}
