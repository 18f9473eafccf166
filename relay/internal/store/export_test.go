package store

// The statements whose plans TestByIDStatementsReadOnlyTheirRows checks.
const (
	RecordResultsSQL = recordResultsSQL
	LoadOwnedSQL     = loadOwnedSQL
	RecordPlans      = recordPlans
	NoTableScan      = noTableScan
)
