// Package ninep is hpcvmm's 9P2000.L file server for a job's host
// directory binds (`-B SRC[:DST[:ro|rw]]`, issue 37): the guest kernel's
// own 9P client mounts each export over a named virtio-console port.
package ninep
