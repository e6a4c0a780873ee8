//go:build integration

package vmm

// SetSetupFaultHook sets the hook New calls after each setup step that took
// a host resource (see faultHook), or clears it with nil. It exists only in
// builds with the integration tag: the integration scenarios use it inside
// L1, where passthrough devices exist, to fail New at each step in turn
// (the VFIO container, each device's open and reset, the DMA mapping)
// while New's other branches run. Set it only while no New runs.
func SetSetupFaultHook(f func(step string) error) { faultHook = f }
