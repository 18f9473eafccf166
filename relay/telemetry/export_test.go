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

// The statements behind Summary and the endpoints' queue counts, whose
// plans the tests check.
const (
	SummarySQL        = summarySQL
	DeliveryHourSQL   = deliveryHourSQL
	EndpointQueuesSQL = endpointQueuesSQL
)
