package pmi

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func socketPair(t testing.TB) (*os.File, *os.File) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	return os.NewFile(uintptr(fds[0]), "a"), os.NewFile(uintptr(fds[1]), "b")
}

func TestFromEnv(t *testing.T) {
	step, err := FromEnv([]string{"PATH=/bin", "SLURM_PROCID=1"})
	require.NoError(t, err)
	assert.Nil(t, step, "no PMI_FD: not started by srun --mpi")

	_, err = FromEnv([]string{"PMI_FD=three"})
	require.ErrorContains(t, err, `PMI_FD="three": not a file descriptor number`)

	f, err := os.CreateTemp(t.TempDir(), "plain")
	require.NoError(t, err)
	defer f.Close()
	_, err = FromEnv([]string{fmt.Sprintf("PMI_FD=%d", f.Fd())})
	require.ErrorContains(t, err, "not a socket")

	_, err = FromEnv([]string{"PMI_FD=987654"})
	require.ErrorContains(t, err, "PMI_FD=987654: bad file descriptor")

	a, b := socketPair(t)
	defer b.Close()
	step, err = FromEnv([]string{
		fmt.Sprintf("PMI_FD=%d", a.Fd()), "PMI_SIZE=2", "PMI_RANK=1", "HOME=/root",
		"SLURM_PROCID=1", "SLURM_JOB_ID=42", "PMI_JOBID=42.0", "SLURMD_NODENAME=n1",
	})
	require.NoError(t, err)
	require.NotNil(t, step)
	defer step.Conn.Close()
	assert.Equal(t, []string{"PMI_JOBID=42.0", "PMI_RANK=1", "PMI_SIZE=2", "SLURM_JOB_ID=42", "SLURM_PROCID=1"}, step.Env,
		"every PMI_* but PMI_FD and every SLURM_*, sorted; nothing else")
	flags, err := unix.FcntlInt(a.Fd(), unix.F_GETFD, 0)
	require.NoError(t, err)
	assert.NotZero(t, flags&unix.FD_CLOEXEC, "srun's socket must not leak into programs hpcvmm starts")
}

// chain wires the whole relay as it runs: srun's socket ↔ hpcvmm (the host
// ends of the two ports) ↔ the two ports (pipes stand in for the
// virtio-console device, which moves bytes and end of stream the same way)
// ↔ the agent's Relay ↔ COMMAND's socket. It returns srun's end and
// COMMAND's end, and a channel with Relay's result.
func chain(t testing.TB) (srun, rank *os.File, relayDone <-chan error) {
	srun, host := socketPair(t)
	inR, inW, err := os.Pipe()
	require.NoError(t, err)
	outR, outW, err := os.Pipe()
	require.NoError(t, err)
	// PortIn: the device reads FromHost (srun's socket) and, at its end,
	// tells the guest (the pipe's close).
	go func() {
		_, _ = Splice(closeWriter{inW}, host, nil)
	}()
	// PortOut: the device writes the guest's bytes into ToHost and closes it
	// when the guest closes the port.
	go func() {
		_, _ = Splice(SocketWriter{File: host}, outR, nil)
		outR.Close()
	}()
	g, err := NewGuest()
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- g.Relay(inR, outW) }()
	t.Cleanup(func() { srun.Close(); host.Close(); inR.Close(); g.Child.Close() })
	return srun, g.Child, done
}

// writeChunks writes p in pieces of the given sizes (cycled, in units of 61
// bytes; 0 means 4 KiB; no sizes: all at once), then ends the sending
// direction.
func writeChunks(f *os.File, p []byte, sizes []byte) error {
	for i := 0; len(p) > 0; i++ {
		n := len(p)
		if len(sizes) > 0 {
			n = int(sizes[i%len(sizes)]) * 61
			if n == 0 {
				n = 4096
			}
		}
		n = min(n, len(p))
		if _, err := f.Write(p[:n]); err != nil {
			return err
		}
		p = p[n:]
	}
	return SocketWriter{File: f}.CloseWrite()
}

// exchange sends toRank from srun and toSrun from the rank, each in its own
// chunking, and returns what each end read up to its end of file.
func exchange(t testing.TB, toRank, toSrun, chunks []byte) (gotRank, gotSrun []byte) {
	srun, rank, relayDone := chain(t)
	type result struct {
		b   []byte
		err error
	}
	readAll := func(f *os.File, c chan<- result) {
		b, err := io.ReadAll(f)
		c <- result{b, err}
	}
	atRank, atSrun := make(chan result, 1), make(chan result, 1)
	go readAll(rank, atRank)
	go readAll(srun, atSrun)
	errs := make(chan error, 2)
	go func() { errs <- writeChunks(srun, toRank, chunks) }()
	go func() { errs <- writeChunks(rank, toSrun, append([]byte{3}, chunks...)) }()
	timeout := time.After(20 * time.Second)
	for range 2 {
		select {
		case err := <-errs:
			require.NoError(t, err)
		case <-timeout:
			t.Fatal("writers stuck: the relay does not drain")
		}
	}
	var r1, r2 result
	for _, pair := range []struct {
		c   chan result
		dst *result
	}{{atRank, &r1}, {atSrun, &r2}} {
		select {
		case *pair.dst = <-pair.c:
			require.NoError(t, pair.dst.err)
		case <-timeout:
			t.Fatal("an end never saw end of file: EOF was not passed on")
		}
	}
	select {
	case err := <-relayDone:
		require.NoError(t, err)
	case <-timeout:
		t.Fatal("Relay did not return after both directions ended")
	}
	return r1.b, r2.b
}

func TestRelayBothWaysWithEndOfFile(t *testing.T) {
	// A PMI-1 conversation's shape: short lines each way, then finalize.
	toRank := []byte("cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\ncmd=barrier_out\ncmd=finalize_ack\n")
	toSrun := []byte("cmd=init pmi_version=1 pmi_subversion=1\ncmd=barrier_in\ncmd=finalize\n")
	gotRank, gotSrun := exchange(t, toRank, toSrun, []byte{1, 2, 9})
	assert.Equal(t, string(toRank), string(gotRank))
	assert.Equal(t, string(toSrun), string(gotSrun))

	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB each way, beyond any buffer
	gotRank, gotSrun = exchange(t, big, big[:len(big)-5], nil)
	assert.True(t, bytes.Equal(big, gotRank), "1 MiB to the rank: %d bytes arrived", len(gotRank))
	assert.True(t, bytes.Equal(big[:len(big)-5], gotSrun), "1 MiB to srun: %d bytes arrived", len(gotSrun))
}

// TestHalfClose: one direction ending does not end the other — srun may
// close its sending side (no more replies) while the rank still writes, and
// the rank's last bytes still arrive.
func TestHalfClose(t *testing.T) {
	srun, rank, _ := chain(t)
	require.NoError(t, SocketWriter{File: srun}.CloseWrite())
	b, err := io.ReadAll(rank)
	require.NoError(t, err)
	assert.Empty(t, b, "the rank reads end of file once srun's side ended")
	_, err = rank.Write([]byte("cmd=finalize\n"))
	require.NoError(t, err, "the rank can still write after srun's side ended")
	require.NoError(t, SocketWriter{File: rank}.CloseWrite())
	got, err := io.ReadAll(srun)
	require.NoError(t, err)
	assert.Equal(t, "cmd=finalize\n", string(got))
}

// FuzzRelay: whatever the bytes and however they are cut into writes, every
// byte arrives at the other end, in order, exactly once, and each end reads
// end of file after the last byte; both directions at once.
func FuzzRelay(f *testing.F) {
	f.Add([]byte("cmd=init pmi_version=1\n"), []byte("cmd=response_to_init rc=0\n"), []byte{1})
	f.Add([]byte{}, []byte("x"), []byte{0, 255})
	f.Add(bytes.Repeat([]byte{0}, 70000), []byte(strings.Repeat("kvsname=", 100)), []byte{200, 3})
	f.Fuzz(func(t *testing.T, toRank, toSrun, chunks []byte) {
		gotRank, gotSrun := exchange(t, toRank, toSrun, chunks)
		if !bytes.Equal(toRank, gotRank) {
			t.Fatalf("srun→rank: sent %d bytes, got %d (not the same)", len(toRank), len(gotRank))
		}
		if !bytes.Equal(toSrun, gotSrun) {
			t.Fatalf("rank→srun: sent %d bytes, got %d (not the same)", len(toSrun), len(gotSrun))
		}
	})
}

type nopHalfCloser struct{ io.Writer }

func (nopHalfCloser) CloseWrite() error { return nil }

// BenchmarkSplice: the relay allocates nothing per chunk.
func BenchmarkSplice(b *testing.B) {
	chunk := make([]byte, 512)
	buf := make([]byte, ChunkSize)
	b.ReportAllocs()
	b.SetBytes(int64(len(chunk)) * 64)
	r := &repeatReader{chunk: chunk}
	var dst HalfCloser = nopHalfCloser{io.Discard}
	for b.Loop() {
		r.left = 64
		if _, err := Splice(dst, r, buf); err != nil {
			b.Fatal(err)
		}
	}
}

type repeatReader struct {
	chunk []byte
	left  int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	r.left--
	return copy(p, r.chunk), nil
}
