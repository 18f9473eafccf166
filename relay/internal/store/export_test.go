package store

// The statements whose plans TestByIDStatementsReadOnlyTheirRows checks.
const (
	RecordResultsSQL = recordResultsSQL
	LoadOwnedSQL     = loadOwnedSQL
	RecordPlans      = recordPlans
	NoTableScan      = noTableScan
)

// CopyAttemptsMin is the batch size from which RecordResults copies its
// attempt rows.
const CopyAttemptsMin = copyAttemptsMin

// CopyEventsMin is the batch size from which an ingest alone copies its
// events.
const CopyEventsMin = copyEventsMin
