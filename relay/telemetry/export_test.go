package telemetry

// SearchEventsQuery exposes the statements SearchEvents runs, for the
// plan tests.
var SearchEventsQuery = searchEventsQuery

// The attempts' readers, for the plan tests.
const (
	RecentAttemptsSQL   = recentAttemptsSQL
	PerMinuteSQL        = perMinuteSQL
	ExactPercentilesSQL = exactPercentilesSQL
)
