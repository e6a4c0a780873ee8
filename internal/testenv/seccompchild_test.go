package testenv

import (
	"errors"
	"fmt"
	"testing"

	"golang.org/x/sys/unix"
)

// TestKernelAnswer: the names the seccomp children report errors by.
func TestKernelAnswer(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, "ok"},
		{fmt.Errorf("set port GUID: %w", unix.EOPNOTSUPP), "EOPNOTSUPP"},
		{fmt.Errorf("netlink: %w", unix.EINVAL), "EINVAL"},
		{errors.New("ibvf: ib0 reports no such VF 2"), "no_such_vf"},
		{errors.New("some other failure"), "some_other_failure"},
	} {
		if got := KernelAnswer(tc.err); got != tc.want {
			t.Errorf("KernelAnswer(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
