// Package ninep is hpcvmm's 9P2000.L file server for a job's host
// directory binds (`-B SRC[:DST[:ro|rw]]`, issue 37). The files travel over
// a named virtio-console port per bind; the guest kernel's own 9P client
// mounts them (trans=fd over a socket pair the agent relays to the port).
// The server is part of hpcvmm and runs with its credentials (the job
// user's under Slurm: SpawnOptions.Credential), so the guest reaches what
// that user can, and only beneath SRC.
//
// # Library
//
// The protocol is github.com/hugelgupf/p9 v0.3.0 (gVisor's 9P2000.L
// package as u-root keeps it; only package p9 is imported): message
// encoding, fid and tag tables, the walk/rename bookkeeping and a client
// the tests use. Its localfs resolves host paths and follows symbolic
// links, so the File behind it is written here. Two of its limits are
// handled in front of it (limitReader): it bounds messages at 4 MiB
// only, so every message's size is checked against Options.MaxMessageSize
// before the library reads it and a Tversion's msize is lowered to it;
// and its Tflush waits for the old tag, so a flush of itself or of
// another flush would hang the connection: such a flush is pointed at no
// tag. Its handlers recover panics (Options.Logf sees them; the tests
// assert none).
//
// # Confinement
//
// Every file the guest holds is a host descriptor (O_PATH), never a path:
//
//   - Walk opens one component at a time beneath its directory's
//     descriptor with openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|
//     RESOLVE_NO_MAGICLINKS and O_NOFOLLOW: a symbolic link, the guest's
//     or the host's, is a node of its own whose text the guest may read
//     and nothing follows. Names are single components; "..", "." and
//     names with "/" are refused (the guest kernel resolves ".." in its
//     own dentry cache, so at the root it stays at the root).
//   - Open of a directory reopens "." beneath its descriptor; of a
//     regular file, its name beneath the parent's descriptor (O_NOFOLLOW,
//     O_NONBLOCK), used only when fstat shows the very inode walked
//     (ESTALE otherwise). Device nodes, FIFOs, sockets and links are never
//     opened (EACCES), mknod is always EPERM, Create is O_CREAT|O_EXCL (an
//     existing node is never opened by it).
//   - Link, rename, unlink, mkdir, symlink: parent descriptors and single
//     names, linkat without AT_SYMLINK_FOLLOW. Chmod and truncate go
//     through a verified open; times by parent and name without following;
//     chown only to the server's own user. No set-user-ID bit is ever
//     set from the guest (set-group-ID only on directories).
//   - A read-only bind answers every changing request EROFS.
//   - Bounds: MaxMessageSize, MaxFids files per connection (EMFILE);
//     Readdir returns what fits the guest's count.
//
// A directory that a host process moves out of SRC while the guest holds
// it stays reachable through the fids the guest already has, as an open
// directory or a bind mount's working directory would; nothing new is
// resolved above it. Extended attributes are not served (EOPNOTSUPP).
// Refusals are reported to Options.Refused; the child writes them to its
// stderr through a RateLimiter (one line per kind per 10 s, with counts).
//
// # File sets
//
// An Export of Files (OpenFileSet) serves a fixed set of host files as one
// flat read-only directory: the host NVIDIA driver's libraries and
// programs in a job's guest (issue 32). Its root is synthetic, a walk from
// it finds the set's names only, and each file is the node above: its
// O_PATH|O_NOFOLLOW descriptor opened by hpcvmm, reopened by name beneath
// its host directory's descriptor and served only while it is that inode.
// The set's links are symbolic links made here, their text a name of the
// set (fileset.go says why links and not a second name of the file).
//
// # Process
//
// The server runs in a child process, hpcvmm's binary as "hpcvmm-9p"
// (Spawn, ChildMain), not in the VMM: the VMM's process-wide seccomp list
// has no file calls and keeps none. The child checks its arguments and
// descriptors, then installs seccomp.FileServer (openat2 is its only open;
// no mknodat, ioctl, execve, socket or ptrace; linkat without
// AT_SYMLINK_FOLLOW or AT_EMPTY_PATH). seccomp cannot see openat2's
// resolve flags (they are behind a pointer), so the filter does not by
// itself keep a compromised server beneath SRC; the code above does, and
// the credentials bound what it could reach.
//
// # Message size and cache mode
//
// Measured with the benchmarks here (p9 client and server in one process
// over a socket pair, 16 MiB file, median of 3, 2-core host, MB/s):
//
//	msize    seq read   seq write   create+write+stat
//	128 KiB    925        315         592 µs
//	512 KiB   1489        296         652 µs
//	1 MiB     1488        532         414 µs
//
// Larger messages win for bulk data and cost nothing for metadata, so the
// default is 1 MiB, the most Linux's trans=fd accepts. Allocations (client
// and server together, per message): about 37 for a read and 39 for a
// write; a Twrite's payload is allocated by the library's decoder for each
// message (its B/op is the data size), the one per-message cost left.
//
// The guest's cache= mode is chosen by the integration bench; what each
// means for changes made on the host meanwhile: none (the default we
// recommend until measured otherwise) sends every stat and read to the
// server, so host-side changes are seen at once and the page cache holds
// nothing twice; loose and mmap keep the guest's page and dentry caches
// (mmap being needed for shared writable mmap), so reads repeat at memory
// speed but a file changed on the host may be seen stale in the guest.
package ninep
