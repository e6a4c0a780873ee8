package agent

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/hpcvmm/hpcvmm/jobproto"
)

// ensureUser adds COMMAND's user and group to the guest's /etc/passwd and
// /etc/group (under root) when the spec names them and IMAGE has no entry
// for their ids, so `id`, `whoami`, `ls -l` and programs that look their
// user up (ssh, MPI launchers, Python's getpass) see the host's names. An
// entry IMAGE already has for the id is left as it is.
func ensureUser(root string, s *jobproto.Start) error {
	if !s.SetUser {
		return nil
	}
	if s.UserName != "" && validName(s.UserName) {
		home := s.Home
		if home == "" || strings.ContainsAny(home, ":\n") {
			home = "/"
		}
		shell := "/bin/sh"
		line := fmt.Sprintf("%s:x:%d:%d::%s:%s", s.UserName, s.UID, s.GID, home, shell)
		if err := addEntry(filepath.Join(root, "etc/passwd"), 2, s.UID, line); err != nil {
			return fmt.Errorf("adding the job's user to /etc/passwd: %w", err)
		}
	}
	if s.GroupName != "" && validName(s.GroupName) {
		line := fmt.Sprintf("%s:x:%d:", s.GroupName, s.GID)
		if err := addEntry(filepath.Join(root, "etc/group"), 2, s.GID, line); err != nil {
			return fmt.Errorf("adding the job's group to /etc/group: %w", err)
		}
	}
	return nil
}

// validName accepts the names a passwd or group file can hold: no field or
// line separators, not empty, bounded.
func validName(n string) bool {
	return n != "" && len(n) <= 256 && !strings.ContainsAny(n, ":\n\x00")
}

// addEntry appends line to the colon-separated file unless a line already
// has id in field idField (0-based).
func addEntry(path string, idField int, id uint32, line string) error {
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	want := strconv.FormatUint(uint64(id), 10)
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) > idField && f[idField] == want {
			return nil
		}
	}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		line = "\n" + line
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return appendLine(path, line)
}
