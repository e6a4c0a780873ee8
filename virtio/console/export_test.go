package console

// SetPortBuffers sets the named ports' input chunk and output ring sizes
// for consoles created afterwards and returns a function restoring them.
func SetPortBuffers(chunk, ring int) (restore func()) {
	c, r := portChunk, outRingSize
	portChunk, outRingSize = chunk, ring
	return func() { portChunk, outRingSize = c, r }
}
