package vmm

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/addrspace"
	"github.com/hpcvmm/hpcvmm/boot"
)

// TestBootCheckErrorNamesTheField shows New's mapping of boot.Check's
// refusals to Config fields goes by the error's Input, not its text: a
// real kernel with an initrd, a command line and RAM that do not fit, and
// a cause whose message mentions "initrd" without being about it.
func TestBootCheckErrorNamesTheField(t *testing.T) {
	img, err := os.ReadFile(synthKernel(t))
	require.NoError(t, err)
	k, err := boot.ParseBzImage(img)
	require.NoError(t, err)
	ramOf := func(size uint64) (ram []boot.RAMRange) {
		for _, r := range addrspace.RAM(size) {
			ram = append(ram, boot.RAMRange{GPA: r.GPA, Size: r.Size})
		}
		return ram
	}
	for _, tc := range []struct {
		name       string
		p          boot.Params
		initrdSize uint64
		want       string
	}{
		{"initrd too big", boot.Params{Kernel: k, RAM: ramOf(64 << 20), CPUs: 1}, 60 << 20, "Initrd"},
		{"command line too long", boot.Params{Kernel: k, RAM: ramOf(512 << 20), CPUs: 1, Cmdline: strings.Repeat("x", int(k.CmdlineSize)+1)}, 0, "Cmdline"},
		{"kernel does not fit", boot.Params{Kernel: k, RAM: ramOf(1 << 20), CPUs: 1}, 4096, "Memory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkErr := boot.Check(tc.p, tc.initrdSize)
			require.Error(t, checkErr)
			var fe *FieldError
			require.True(t, errors.As(bootCheckError(checkErr), &fe))
			assert.Equal(t, tc.want, fe.Field, "field for %q", checkErr)
			assert.Equal(t, checkErr.Error(), fe.Err.Error(), "the message is boot's")
		})
	}
	// The text does not decide: a RAM refusal that names an initrd is
	// still Memory's, an initrd refusal whatever its words is Initrd's.
	var fe *FieldError
	require.True(t, errors.As(bootCheckError(&boot.CheckError{Input: boot.InputRAM, Err: errors.New("no room for the initrd")}), &fe))
	assert.Equal(t, "Memory", fe.Field)
	require.True(t, errors.As(bootCheckError(&boot.CheckError{Input: boot.InputInitrd, Err: errors.New("too big")}), &fe))
	assert.Equal(t, "Initrd", fe.Field)
}
