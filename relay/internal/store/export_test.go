package store

import "context"

// ReleaseAbandoned releases the deliveries of every owner gone now
// (DeadOwners, then ReleaseAbandonedOf), without the sweep's wait: the
// tests of the judgement itself.
func (s *Store) ReleaseAbandoned(ctx context.Context, limit int) (int64, error) {
	owners, err := s.DeadOwners(ctx)
	if err != nil {
		return 0, err
	}
	return s.ReleaseAbandonedOf(ctx, owners, limit, nil)
}

// The statements whose plans TestByIDStatementsReadOnlyTheirRows checks.
const (
	RecordResultsSQL = recordResultsSQL
	SweepEventsSQL   = sweepEventsSQL
	PlanUnderWaySQL  = planUnderWaySQL
	LoadUnderWaySQL  = loadUnderWaySQL
	KeyPlans         = keyPlans
	LoadOwnedSQL     = loadOwnedSQL
	RecordPlans      = recordPlans
	NoTableScan      = noTableScan
)

// The statements every heartbeat runs, which TestHeartbeatStatementsKeepTheirPlans
// checks.
var (
	DeadOwnersSQL     = deadOwnersSQL
	AliveInstancesSQL = aliveInstancesSQL
)

// PurgeOutboxSQL is PurgeIngestedOutbox's statement, whose plan
// TestPurgeIngestedOutboxReadsOnlyItsWindow checks.
var PurgeOutboxSQL = purgeOutboxSQL

// CopyAttemptsMin is the batch size from which RecordResults copies its
// attempt rows.
const CopyAttemptsMin = copyAttemptsMin

// CopyEventsMin is the batch size from which an ingest alone copies its
// events.
const CopyEventsMin = copyEventsMin

// InTx reports whether a transaction is open.
func (ic *IngestConn) InTx() bool { return ic.inTx }

// The events under way, which the tests write and read directly.
var (
	AddUnderWay    = addUnderWay
	RecordUnderWay = recordUnderWay
	SweepUnderWay  = sweepOwnersUnderWay
)

type (
	UnderWayResult = underWayResult
	Copier         = copier
)

// HealthQuietFor is how far behind the latest success an endpoint's
// last_success_at may lag.
const HealthQuietFor = healthQuietFor
