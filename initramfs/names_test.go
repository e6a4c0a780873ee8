package initramfs

// The file names package filecache gives the cache's own files, for the
// tests that list a cache directory.
const (
	okExt      = ".ok"
	hashExt    = ".hash"
	tempPrefix = ".tmp-"
)
