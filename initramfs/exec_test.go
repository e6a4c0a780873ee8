package initramfs

import (
	"os"
	"os/exec"
)

// runCmd runs a tool with stdin from the file in (none when empty).
func runCmd(tool, in string, args ...string) (string, error) {
	cmd := exec.Command(tool, args...)
	if in != "" {
		f, err := os.Open(in)
		if err != nil {
			return "", err
		}
		defer f.Close()
		cmd.Stdin = f
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}
