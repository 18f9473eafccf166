// The recorder's writes: a batch of results into deliveries, attempts and
// endpoint health, in one transaction (RecordResults).

package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

const recordResultsSQL = `
WITH u AS (
UPDATE postbox.deliveries d SET
  status = CASE WHEN r.status = 'released'
                THEN CASE WHEN d.attempt_count = 0 THEN 'pending' ELSE 'failed' END
                ELSE r.status END,
  attempt_count = d.attempt_count + CASE WHEN r.attempted THEN 1 ELSE 0 END,
  next_attempt_at = CASE WHEN r.status IN ('failed', 'released') THEN now() + r.delay_s * interval '1 second'
                         ELSE d.next_attempt_at END,
  last_error = CASE WHEN r.attempted THEN nullif(r.last_error, '') ELSE d.last_error END,
  last_status_code = CASE WHEN r.attempted THEN nullif(r.status_code, 0) ELSE d.last_status_code END,
  last_response_ms = CASE WHEN r.attempted THEN r.response_ms ELSE d.last_response_ms END,
  last_response = CASE WHEN r.attempted THEN nullif(r.response, '') ELSE d.last_response END,
  delivered_at = CASE WHEN r.status = 'delivered' THEN r.at ELSE d.delivered_at END,
  commit_to_delivery_ms = CASE WHEN r.status = 'delivered' THEN nullif(r.c2d_ms, -1) ELSE d.commit_to_delivery_ms END,
  attempt_target = CASE WHEN r.inline AND d.attempt_count = 0 THEN nullif(r.target, '') ELSE d.attempt_target END,
  attempt_sent = CASE WHEN r.inline AND d.attempt_count = 0 THEN nullif(r.sent, '') ELSE d.attempt_sent END,
  attempted_by = CASE WHEN r.inline AND d.attempt_count = 0 THEN $11 ELSE d.attempted_by END,
  attempt_revision = CASE WHEN r.inline AND d.attempt_count = 0 THEN nullif(r.revision, 0) ELSE d.attempt_revision END,
  lease_owner = CASE WHEN r.keep THEN $11 END, updated_at = now()
FROM unnest($1::int8[], $2::text[], $3::float8[], $4::bool[], $5::text[], $6::int4[], $7::float4[], $8::text[], $9::timestamptz[], $10::float4[],
            $12::bool[], $13::text[], $14::int8[], $15::text[], $16::bool[])
  AS r(id, status, delay_s, attempted, last_error, status_code, response_ms, response, at, c2d_ms, inline, target, revision, sent, keep)
WHERE d.id = ANY($1) AND d.id = r.id
  AND (d.status IS NOT DISTINCT FROM 'in_flight' OR d.status IS NOT DISTINCT FROM 'failed') -- a kept retry's
  AND d.lease_owner IS NOT DISTINCT FROM $11
RETURNING CASE WHEN r.inline AND d.attempted_by IS NOT NULL THEN d.id END AS inlined
)
SELECT inlined FROM u WHERE inlined IS NOT NULL`

const insertAttemptsSQL = `
INSERT INTO postbox.attempts (delivery_id, endpoint, attempt, started_at, duration_ms, status_code, outcome,
                              error_class, error, response, target, instance, endpoint_revision, sent)
SELECT id, endpoint, attempt, started_at, duration_ms, nullif(status_code, 0), outcome,
       nullif(error_class, ''), nullif(error, ''), nullif(response, ''), nullif(target, ''), $12, nullif(revision, 0), nullif(sent, '')
FROM unnest($1::int8[], $2::text[], $3::int4[], $4::timestamptz[], $5::float4[], $6::int4[], $7::text[],
            $8::text[], $9::text[], $10::text[], $11::text[], $13::int8[], $14::text[])
  AS a(id, endpoint, attempt, started_at, duration_ms, status_code, outcome, error_class, error, response, target, revision, sent)`

// earliestRetry is the least delay of the retries rs schedules and the
// claims it releases, if any.
func earliestRetry(rs []state.Result) (time.Duration, bool) {
	var due time.Duration
	found := false
	for i := range rs {
		if st := rs[i].Status; (st == postboxtype.DeliveryFailed && !rs[i].Keep) || st == state.Released {
			if !found || rs[i].Delay < due {
				due, found = rs[i].Delay, true
			}
		}
	}
	return due, found
}

// attemptRows are the columns of the attempts a batch inserts.
type attemptRows struct {
	ids                                                 []int64
	endpoints, outcomes, classes, errs, bodies, targets []string
	sents                                               []string
	nums, codes                                         []int32
	started                                             []time.Time
	ms                                                  []float32
	revisions                                           []int64
}

func (a *attemptRows) add(r state.Result) {
	a.ids, a.endpoints, a.nums = append(a.ids, r.DeliveryID), append(a.endpoints, r.Endpoint), append(a.nums, int32(r.Attempt))
	a.started = append(a.started, attemptStart(r))
	a.ms, a.codes, a.outcomes = append(a.ms, float32(r.ResponseMS)), append(a.codes, int32(r.StatusCode)), append(a.outcomes, string(r.Status))
	a.classes, a.errs, a.bodies, a.targets = append(a.classes, r.ErrorClass), append(a.errs, r.LastError), append(a.bodies, r.Response), append(a.targets, r.Target)
	a.revisions, a.sents = append(a.revisions, r.EndpointRevision), append(a.sents, r.Sent)
}

// attemptStart is when r's request started: its outcome's time less its
// response time.
func attemptStart(r state.Result) time.Time {
	return r.At.Add(-time.Duration(r.ResponseMS * float64(time.Millisecond)))
}

func (a *attemptRows) args(instance string) []any {
	return []any{a.ids, a.endpoints, a.nums, a.started, a.ms, a.codes, a.outcomes, a.classes, a.errs, a.bodies, a.targets, instance, a.revisions, a.sents}
}

// copyAttemptsMin is the number of attempts from which a batch copies
// its attempt rows into the table (COPY FROM STDIN, binary) instead of
// inserting them from arrays. COPY writes a page's worth of new rows as one
// WAL record where an insert writes one per row, and every record costs the
// walsender a turn of its loop; it skips the arrays' unnest too. It costs
// a round trip of its own, so small batches (live traffic's) insert.
const copyAttemptsMin = 32

// attemptColumnNames are postbox.attempts' columns in copyRows' order.
var attemptColumnNames = []string{"delivery_id", "endpoint", "attempt", "started_at", "duration_ms", "status_code",
	"outcome", "error_class", "error", "response", "target", "instance", "endpoint_revision", "sent"}

// copyRows are the attempts as COPY's rows, with insertAttemptsSQL's NULLs
// (no status code, no error class, error, response or target).
func (a *attemptRows) copyRows(instance string) pgx.CopyFromSource {
	return pgx.CopyFromSlice(len(a.ids), func(i int) ([]any, error) {
		var code any
		if a.codes[i] != 0 {
			code = a.codes[i]
		}
		var rev any
		if a.revisions[i] != 0 {
			rev = a.revisions[i]
		}
		return []any{a.ids[i], a.endpoints[i], a.nums[i], a.started[i], a.ms[i], code,
			a.outcomes[i], orNull(a.classes[i]), orNull(a.errs[i]), orNull(a.bodies[i]), orNull(a.targets[i]), instance, rev, orNull(a.sents[i])}, nil
	})
}

// firstOnDelivery reports whether r's attempt is kept on its delivery's
// row rather than in an attempt row of its own (migration 026): a first
// attempt that delivered. The update keeps it there only if the delivery
// had no attempt before (attempt_count 0); RecordResults inserts a row for
// any it did not keep.
func firstOnDelivery(r state.Result) bool {
	return r.Sampled && r.Attempted && r.Attempt == 1 && r.Status == postboxtype.DeliveryDelivered
}

// HealthFunc computes an endpoint's new health from its current row (a
// closed one when it has none) and the batch's results for it, in order.
type HealthFunc func(cur Health, rs []state.Result) Health

// HealthChange is one endpoint's health before and after a batch.
type HealthChange struct {
	Old, New Health
}

// RecordResults writes a batch of results in one transaction: the
// deliveries (only those still leased to owner: a lease lost to another
// instance is not overwritten), each request's attempt, and the health of
// each endpoint concerned, computed by apply while its row is locked, so
// instances recording at once see each other's streaks. It returns the
// health of those endpoints before and after.
//
// An attempt is a row of postbox.attempts, but with hist, a first attempt
// that delivered (firstOnDelivery) is kept on its delivery's row by the
// update itself (postbox.all_attempts shows both): one index entry where
// the row cost a heap tuple and two. The update returns the deliveries it
// kept one on; one it did not (the lease was lost) gets its row.
//
// The attempts' latency is counted in hist and added to the histograms
// with the first batch after HistogramFlushDefault (or by
// FlushHistograms); with hist nil, the attempts table's trigger counts
// them in this transaction. Results the ingest wrote (Written) update
// neither the delivery nor the attempts: they are counted into hist (their
// rows were inserted with the trigger set aside, so with hist nil they are
// not counted; the relay always has one) and move the health.
func (s *Store) RecordResults(ctx context.Context, owner string, rs []state.Result, apply HealthFunc, hist *Histograms) ([]HealthChange, error) {
	return s.RecordResultsTelling(ctx, owner, rs, apply, hist, false)
}

// RecordResultsTelling is RecordResults that, with tell, also NOTIFYs the
// other instances when the batch schedules a retry or releases a claim
// (WakeRetryPayload, the earliest): one that is free claims it when due,
// not at its sweep. A NOTIFY goes out with the commit, and costs the
// commit a lock that notifying transactions share; an instance alone has
// no one to tell.
func (s *Store) RecordResultsTelling(ctx context.Context, owner string, rs []state.Result, apply HealthFunc, hist *Histograms, tell bool) ([]HealthChange, error) {
	if len(rs) == 0 {
		return nil, nil
	}
	var wake string
	if tell {
		if due, ok := earliestRetry(rs); ok {
			wake = WakeRetryPayload(owner, due)
		}
	}
	n := len(rs)
	ids, statuses, delays := make([]int64, 0, n), make([]string, 0, n), make([]float64, 0, n)
	attempted, errs, codes := make([]bool, 0, n), make([]string, 0, n), make([]int32, 0, n)
	ms, bodies, ats, c2d := make([]float32, 0, n), make([]string, 0, n), make([]time.Time, 0, n), make([]float32, 0, n)
	inlines, targets, sents := make([]bool, 0, n), make([]string, 0, n), make([]string, 0, n)
	revisions, keeps := make([]int64, 0, n), make([]bool, 0, n)
	// attempts are inserted; written, those the ingest wrote (Written),
	// are only counted into the histograms, and so are inline, first
	// attempts that delivered, which the update keeps on their deliveries
	// (firstOnDelivery).
	var attempts attemptRows
	var written, inline []int  // indexes into rs
	var under []underWayResult // events under way: their deliveries are inserted
	for i := range rs {
		r := &rs[i]
		if r.Written {
			written = append(written, i)
			continue
		}
		if r.DeliveryID == 0 && r.Range != 0 {
			under = append(under, underWayResult{Result: r,
				Inline: hist != nil && firstOnDelivery(*r)})
			continue
		}
		in := hist != nil && firstOnDelivery(*r)
		ids, statuses, delays = append(ids, r.DeliveryID), append(statuses, string(r.Status)), append(delays, r.Delay.Seconds())
		attempted, errs, codes = append(attempted, r.Attempted), append(errs, r.LastError), append(codes, int32(r.StatusCode))
		ms, bodies = append(ms, float32(r.ResponseMS)), append(bodies, r.Response)
		ats, c2d = append(ats, r.At), append(c2d, float32(r.CommitToDeliveryMS))
		inlines, targets, revisions = append(inlines, in), append(targets, r.Target), append(revisions, r.EndpointRevision)
		sents, keeps = append(sents, r.Sent), append(keeps, r.Keep && r.Status == postboxtype.DeliveryFailed)
		switch {
		case in:
			inline = append(inline, i)
		case r.Sampled:
			attempts.add(*r)
		}
	}
	byEndpoint := groupForHealth(rs)
	// Health rows are locked in name order, so concurrent instances lock
	// them in the same order.
	names := make([]string, 0, len(byEndpoint))
	for name := range byEndpoint {
		names = append(names, name)
	}
	sort.Strings(names)

	var counts map[histKey]int64
	flush := false
	if hist != nil && len(attempts.ids)+len(written)+len(inline)+len(under) > 0 {
		counts = countAttempts(&attempts)
		for i := range under {
			if r := under[i].Result; r.Sampled {
				counts[histKey{r.Endpoint, latencyBin(attemptStart(*r)), latencyBucket(float32(r.ResponseMS))}]++
			}
		}
		for _, i := range slices.Concat(written, inline) {
			r := &rs[i]
			counts[histKey{r.Endpoint, latencyBin(attemptStart(*r)), latencyBucket(float32(r.ResponseMS))}]++
		}
		if pending, due := hist.Pending(); pending && !time.Now().Before(due) {
			flush = true
			for k, n := range hist.counts {
				counts[k] += n
			}
		}
	}
	var changes []HealthChange
	// The endpoints' health rows are read without a lock and written only
	// if no one wrote them since (see recordHealth); when one was, the
	// transaction runs again with every row locked.
	for lockAll := false; ; lockAll = true {
		err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
			// First, while the planner may still loop over the batch
			// (recordPlans, below, rules that out for the rest of the
			// transaction): the events under way are found by key.
			// Their attempts that are not kept on their rows get rows of
			// their own, in the batch below: after histogramMode, as the
			// recorder counts them in memory.
			var underAttempts attemptRows
			if len(under) > 0 {
				ids, err := recordUnderWay(ctx, tx, owner, under)
				if err != nil {
					return err
				}
				for i := range under {
					u := &under[i]
					u.Result.WrittenAs = ids[u.Result.EventPK]
					if id := ids[u.Result.EventPK]; id != 0 && u.Result.Sampled && !u.Inline {
						r := *u.Result
						r.DeliveryID = id
						underAttempts.add(r)
					}
				}
			}
			// Pinned for every batch, also one that updates no delivery
			// (its results all written by the ingest, as at live rates
			// most are): its reads of the endpoints' health were otherwise
			// planned at every run, dearer than running them.
			b := &pgx.Batch{}
			b.Queue(recordPlans)
			var onRow map[int64]bool // the inline attempts the update kept
			if len(ids) > 0 {
				b.Queue(recordResultsSQL, ids, statuses, delays, attempted, errs, codes, ms, bodies, ats, c2d, owner,
					inlines, targets, revisions, sents, keeps).Query(func(rows pgx.Rows) error {
					got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
					onRow = make(map[int64]bool, len(got))
					for _, id := range got {
						onRow[id] = true
					}
					return err
				})
			}
			if hist != nil && len(attempts.ids)+len(inline)+len(underAttempts.ids) > 0 {
				b.Queue(histogramMode)
			}
			if len(attempts.ids) > 0 && len(attempts.ids) < copyAttemptsMin {
				b.Queue(insertAttemptsSQL, attempts.args(owner)...)
			}
			if len(underAttempts.ids) > 0 {
				b.Queue(insertAttemptsSQL, underAttempts.args(owner)...)
			}
			if flush {
				queueHistogramUpsert(b, counts)
			}
			if wake != "" {
				b.Queue(`SELECT pg_notify($1, $2)`, WakeChannel, wake)
			}
			// The first time, every row is read without a lock, with its
			// version (see recordHealth); again, every row under its lock.
			var locking, reading []string
			if lockAll {
				locking = names
			} else {
				reading = names
			}
			var locked, read map[string]Health
			var versions map[string]string
			if len(locking) > 0 {
				b.Queue(selectHealthSQL+` WHERE endpoint = ANY($1) ORDER BY endpoint FOR UPDATE`, locking).Query(func(rows pgx.Rows) error {
					var err error
					locked, _, err = collectHealthVersions(rows, false)
					return err
				})
			}
			if len(reading) > 0 {
				b.Queue(selectHealthVersionsSQL+` WHERE endpoint = ANY($1)`, reading).Query(func(rows pgx.Rows) error {
					var err error
					read, versions, err = collectHealthVersions(rows, true)
					return err
				})
			}
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
			// An inline attempt whose delivery the update did not keep it on
			// (no longer this instance's: its lease was taken) gets its row.
			var apart attemptRows
			for _, i := range inline {
				if !onRow[rs[i].DeliveryID] {
					apart.add(rs[i])
				}
			}
			if len(apart.ids) > 0 {
				if _, err := tx.Exec(ctx, insertAttemptsSQL, apart.args(owner)...); err != nil {
					return fmt.Errorf("insert attempts: %w", err)
				}
			}
			if len(attempts.ids) >= copyAttemptsMin {
				if _, err := tx.CopyFrom(ctx, pgx.Identifier{"postbox", "attempts"}, attemptColumnNames, attempts.copyRows(owner)); err != nil {
					return fmt.Errorf("copy attempts: %w", err)
				}
			}
			var err error
			changes, err = s.recordHealth(ctx, tx, locking, locked, reading, read, versions, byEndpoint, apply)
			return err
		})
		if errors.Is(err, errHealthChanged) && !lockAll {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("record results: %w", err)
		}
		break
	}
	switch {
	case flush:
		clear(hist.counts)
		hist.flushed = time.Now()
	case counts != nil:
		for k, n := range counts {
			hist.counts[k] += n
		}
	}
	return changes, nil
}

// groupForHealth returns, by lane, the results that feed its health (see
// HealthFunc), in their order, copied once into one array.
func groupForHealth(rs []state.Result) map[string][]state.Result {
	counts := map[string]int{}
	total := 0
	for i := range rs {
		if r := &rs[i]; feedsHealth(r) {
			counts[r.Key()]++
			total++
		}
	}
	all := make([]state.Result, total)
	out := make(map[string][]state.Result, len(counts))
	off := 0
	for k, n := range counts {
		out[k] = all[off : off : off+n]
		off += n
	}
	for i := range rs {
		if r := &rs[i]; feedsHealth(r) {
			out[r.Key()] = append(out[r.Key()], *r)
		}
	}
	return out
}

// feedsHealth reports whether a result changes its lane's health: an
// attempt, a breaker signal or a pause.
func feedsHealth(r *state.Result) bool {
	return r.Sampled || r.Attempted || r.Signal != state.SignalNone || r.Pause > 0
}
