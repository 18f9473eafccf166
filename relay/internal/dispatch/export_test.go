package dispatch

// The lanes' limits, which the tests fill lanes up to.
var (
	AheadLimit        = aheadLimit
	KeptLaneLimit     = keptLaneLimit
	DrainingLaneLimit = drainingLaneLimit
)
