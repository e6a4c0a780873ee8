package agent

import (
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/hpcvmm/hpcvmm/jobproto"
)

// DefaultPath is COMMAND's PATH when the spec's environment has none: the
// one Docker and most distributions' /etc/profile set for root.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Env is COMMAND's environment: the spec's, with PATH, HOME and (with a
// pty) TERM added where the spec has none, as a login would set them, and
// the host driver's directories appended to LD_LIBRARY_PATH and PATH when
// the spec mounts them (jobproto.DriverLibDir, DriverBinDir).
func Env(s *jobproto.Start) []string {
	env := append([]string(nil), s.Env...)
	has := func(k string) bool {
		for _, kv := range env {
			if strings.HasPrefix(kv, k+"=") {
				return true
			}
		}
		return false
	}
	if !has("PATH") {
		env = append(env, "PATH="+DefaultPath)
	}
	if !has("HOME") {
		home := "/root"
		if s.SetUser && s.UID != 0 {
			home = "/"
			if s.Home != "" {
				home = s.Home
			}
		}
		env = append(env, "HOME="+home)
	}
	if s.TTY && !has("TERM") {
		env = append(env, "TERM=xterm")
	}
	for _, m := range s.Mounts {
		switch m.Target {
		case jobproto.DriverLibDir:
			env = appendPathList(env, "LD_LIBRARY_PATH", m.Target)
		case jobproto.DriverBinDir:
			env = appendPathList(env, "PATH", m.Target)
		}
	}
	return env
}

// appendPathList appends dir to the colon-separated list key of env (its
// last value, the one exec passes on), or sets it to dir: the host
// driver's directories come after IMAGE's own, as Apptainer's --nv
// appends its library directory, so a program of IMAGE named like one of
// the driver's wins.
func appendPathList(env []string, key, dir string) []string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], key+"="); ok {
			if v == "" {
				env[i] = key + "=" + dir
			} else {
				env[i] = key + "=" + v + ":" + dir
			}
			return env
		}
	}
	return append(env, key+"="+dir)
}

// getenv is the last value of key in env (the one exec gives the process).
func getenv(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
		}
	}
	return v
}

// LookPath finds argv0 as execvp would, in the PATH of env, under root (the
// guest's /; a directory in tests): a name with a slash is taken as is, else
// the first PATH entry holding an executable regular file wins. It returns
// the path (without root) or the failure to report: not found when nothing
// by that name exists, not executable when only non-executable files (or
// directories) do.
func LookPath(root, argv0 string, env []string) (string, *jobproto.Failed) {
	if argv0 == "" {
		return "", &jobproto.Failed{Kind: jobproto.FailNotFound, Reason: "empty command name"}
	}
	if strings.Contains(argv0, "/") {
		if f := checkExecutable(root, argv0); f != nil {
			return "", f
		}
		return argv0, nil
	}
	path := getenv(env, "PATH")
	var notExec *jobproto.Failed
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, argv0)
		f := checkExecutable(root, p)
		if f == nil {
			return p, nil
		}
		if f.Kind == jobproto.FailNotExecutable && notExec == nil {
			notExec = f
		}
	}
	if notExec != nil {
		return "", notExec
	}
	return "", &jobproto.Failed{Kind: jobproto.FailNotFound, Reason: fmt.Sprintf("%s: command not found in PATH %s", argv0, path)}
}

// checkExecutable says why p (under root) cannot be executed, or nil.
func checkExecutable(root, p string) *jobproto.Failed {
	st, err := os.Stat(filepath.Join(root, p))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return &jobproto.Failed{Kind: jobproto.FailNotFound, Reason: p + ": no such file"}
	case err != nil:
		return &jobproto.Failed{Kind: jobproto.FailNotExecutable, Reason: err.Error()}
	case st.IsDir():
		return &jobproto.Failed{Kind: jobproto.FailNotExecutable, Reason: p + ": is a directory"}
	case !st.Mode().IsRegular():
		return &jobproto.Failed{Kind: jobproto.FailNotExecutable, Reason: p + ": not a regular file"}
	case st.Mode().Perm()&0o111 == 0:
		return &jobproto.Failed{Kind: jobproto.FailNotExecutable, Reason: p + ": permission denied (no execute bit)"}
	}
	return nil
}

// Command is COMMAND as an exec.Cmd for the spec: path (from LookPath),
// argv, the environment (Env), the working directory, the user, and its own
// process group, so signals from the host reach it and its children but
// not the agent. With tty the process gets a new session with stdin as its
// controlling terminal instead. The caller sets the streams.
func Command(s *jobproto.Start, path string, env []string) *exec.Cmd {
	cmd := &exec.Cmd{Path: path, Args: s.Argv, Env: env, Dir: s.Workdir}
	if cmd.Dir == "" {
		cmd.Dir = "/"
	}
	attr := &syscall.SysProcAttr{}
	if s.TTY {
		attr.Setsid, attr.Setctty, attr.Ctty = true, true, 0
	} else {
		attr.Setpgid = true
	}
	if s.SetUser {
		// Groups never nil: setgroups with the spec's list (empty: none),
		// so the command does not keep root's supplementary groups.
		groups := append([]uint32{}, s.Groups...)
		attr.Credential = &syscall.Credential{Uid: s.UID, Gid: s.GID, Groups: groups}
	}
	cmd.SysProcAttr = attr
	return cmd
}

// CheckWorkdir reports a working directory that is not a directory in the
// guest (under root) as an agent failure, before anything is started.
func CheckWorkdir(root, dir string) *jobproto.Failed {
	if dir == "" {
		return nil
	}
	st, err := os.Stat(filepath.Join(root, dir))
	if err != nil {
		return &jobproto.Failed{Kind: jobproto.FailAgent, Reason: fmt.Sprintf("--workdir %s: %v", dir, unwrapPath(err))}
	}
	if !st.IsDir() {
		return &jobproto.Failed{Kind: jobproto.FailAgent, Reason: fmt.Sprintf("--workdir %s: not a directory", dir)}
	}
	return nil
}

func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// StartFailure classifies the error of starting path (under root) as the
// failure to report. execve's ENOENT for a file that exists means its
// interpreter is missing: for an ELF that is the dynamic loader (IMAGE has
// no usable libc for it), an agent failure (125) naming it; for a script,
// the #! interpreter, not executable (126) as the shell reports it.
func StartFailure(root, path string, err error) *jobproto.Failed {
	var errno syscall.Errno
	errors.As(err, &errno)
	switch errno {
	case syscall.ENOENT:
		if _, serr := os.Stat(filepath.Join(root, path)); serr != nil {
			return &jobproto.Failed{Kind: jobproto.FailNotFound, Reason: path + ": no such file"}
		}
		if interp, ok := elfInterpreter(filepath.Join(root, path)); ok {
			return &jobproto.Failed{Kind: jobproto.FailAgent, Reason: fmt.Sprintf(
				"%s: its ELF interpreter %s is missing from the image (a dynamic binary without its C library)", path, interp)}
		}
		if interp, ok := scriptInterpreter(filepath.Join(root, path)); ok {
			return &jobproto.Failed{Kind: jobproto.FailNotExecutable, Reason: fmt.Sprintf("%s: bad interpreter %s: no such file", path, interp)}
		}
		return &jobproto.Failed{Kind: jobproto.FailAgent, Reason: fmt.Sprintf("%s: %v", path, err)}
	case syscall.EACCES, syscall.ENOEXEC, syscall.EISDIR, syscall.ETXTBSY, syscall.EPERM:
		return &jobproto.Failed{Kind: jobproto.FailNotExecutable, Reason: fmt.Sprintf("%s: %v", path, unwrapPath(err))}
	}
	return &jobproto.Failed{Kind: jobproto.FailAgent, Reason: fmt.Sprintf("starting %s: %v", path, err)}
}

// elfInterpreter is the PT_INTERP of the ELF file at p.
func elfInterpreter(p string) (string, bool) {
	f, err := elf.Open(p)
	if err != nil {
		return "", false
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type != elf.PT_INTERP || prog.Filesz > 4096 {
			continue
		}
		b := make([]byte, prog.Filesz)
		if _, err := prog.ReadAt(b, 0); err != nil {
			return "", false
		}
		return strings.TrimRight(string(b), "\x00"), true
	}
	return "", false
}

// scriptInterpreter is the interpreter named by a #! line of the file at p.
func scriptInterpreter(p string) (string, bool) {
	f, err := os.Open(p)
	if err != nil {
		return "", false
	}
	defer f.Close()
	b := make([]byte, 256)
	n, _ := f.Read(b)
	b = b[:n]
	if len(b) < 2 || b[0] != '#' || b[1] != '!' {
		return "", false
	}
	line, _, _ := strings.Cut(string(b[2:]), "\n")
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return "", false
	}
	return fields[0], true
}
