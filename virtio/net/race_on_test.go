//go:build race

package net

// raceEnabled: guest memory is shared between the test (playing the guest)
// and the device goroutine without Go synchronization, exactly as with a
// real guest, so the race detector flags it by design.
const raceEnabled = true
