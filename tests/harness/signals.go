package harness

// ProfileSignals is ProfilePassthrough in an L1 boot of its own, for
// TestBootsWithSignals: its twenty L2 boots take about ten minutes of L1
// time on a loaded machine, which together with the other passthrough
// scenarios would not fit in one L1 boot's limit (HPCVMM_L1_TIMEOUT,
// default 15 minutes).
var ProfileSignals = func() Profile {
	p := ProfilePassthrough
	p.Name = "signals"
	return p
}()

// Registered here rather than in the Profiles literal so the list stays
// one line other profiles are added to.
func init() { Profiles = append(Profiles, ProfileSignals) }
