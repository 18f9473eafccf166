package telemetry

// SearchEventsQuery exposes the statements SearchEvents runs, for the
// plan tests.
var SearchEventsQuery = searchEventsQuery
