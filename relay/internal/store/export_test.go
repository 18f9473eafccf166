package store

// The statements whose plans TestByIDStatementsReadOnlyTheirRows checks.
const (
	RecordResultsSQL = recordResultsSQL
	LoadOwnedSQL     = loadOwnedSQL
	NoLoops          = noLoops
	NoTableScan      = noTableScan
)
