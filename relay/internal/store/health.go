package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// Health is an endpoint's row in postbox.endpoint_health: its circuit
// breaker, its streaks, a receiver's pause, and its latency statistics.
type Health struct {
	Endpoint            string
	State               postboxtype.BreakerState
	ConsecutiveFailures int
	FailureThreshold    int // the threshold in force (halved for a slow endpoint)
	Cooldown            time.Duration
	OpenedAt            time.Time
	LastSuccessAt       time.Time
	LastFailureAt       time.Time
	LastError           string
	LastStatusCode      int
	PausedUntil         time.Time
	ProbeOwner          string
	P50MS, P95MS, P99MS float64 // 0 when unknown
	SampleCount         int
}

const selectHealthSQL = `
SELECT endpoint, state, consecutive_failures, coalesce(failure_threshold, 0), cooldown_seconds, opened_at,
       last_success_at, last_failure_at, coalesce(last_error, ''), coalesce(last_status_code, 0),
       paused_until, coalesce(probe_owner, ''), coalesce(p50_ms, 0), coalesce(p95_ms, 0), coalesce(p99_ms, 0),
       sample_count
FROM postbox.endpoint_health`

// selectHealthVersionsSQL is selectHealthSQL with each row's version
// (its xmin, which every write of the row changes) last.
const selectHealthVersionsSQL = `
SELECT endpoint, state, consecutive_failures, coalesce(failure_threshold, 0), cooldown_seconds, opened_at,
       last_success_at, last_failure_at, coalesce(last_error, ''), coalesce(last_status_code, 0),
       paused_until, coalesce(probe_owner, ''), coalesce(p50_ms, 0), coalesce(p95_ms, 0), coalesce(p99_ms, 0),
       sample_count, xmin::text
FROM postbox.endpoint_health`

func collectHealth(rows pgx.Rows) (map[string]Health, error) {
	out, _, err := collectHealthVersions(rows, false)
	return out, err
}

// collectHealthVersions collects selectHealthSQL's rows, or with versions
// selectHealthVersionsSQL's, and then also their versions by endpoint.
func collectHealthVersions(rows pgx.Rows, versions bool) (map[string]Health, map[string]string, error) {
	out := map[string]Health{}
	var vers map[string]string
	if versions {
		vers = map[string]string{}
	}
	for rows.Next() {
		var h Health
		var cooldown float64
		var opened, success, failure, paused *time.Time
		dest := []any{&h.Endpoint, &h.State, &h.ConsecutiveFailures, &h.FailureThreshold, &cooldown, &opened,
			&success, &failure, &h.LastError, &h.LastStatusCode, &paused, &h.ProbeOwner,
			&h.P50MS, &h.P95MS, &h.P99MS, &h.SampleCount}
		var ver string
		if versions {
			dest = append(dest, &ver)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, nil, err
		}
		h.Cooldown = time.Duration(cooldown * float64(time.Second))
		h.OpenedAt, h.LastSuccessAt, h.LastFailureAt, h.PausedUntil = deref(opened), deref(success), deref(failure), deref(paused)
		out[h.Endpoint] = h
		if versions {
			vers[h.Endpoint] = ver
		}
	}
	return out, vers, rows.Err()
}

func deref(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// healthQuietFor is how far behind the latest success an endpoint's
// last_success_at may stay: a batch that changes nothing else of the row
// writes it only once it is this much newer.
const healthQuietFor = time.Second

// errHealthChanged ends a RecordResults transaction in which an endpoint's
// row read without a lock was written by another before this one's write:
// it runs again with the lock.
var errHealthChanged = errors.New("endpoint health changed: record again with its row locked")

// recordHealth applies a batch's results to the endpoints' health and
// writes what changed, in tx.
//
// The rows of reading were read without a lock, each with its version.
// Most batches of successes change nothing but the latest success (the
// endpoint stays closed with no failures): the row is left alone, or, once
// its last_success_at is healthQuietFor behind, only that moves forward,
// by a plain update (the later time wins). A row that changes otherwise
// (a failure's streak, a breaker, a pause, a first row) is written only if
// its version is still the one read, by an update that locks no more than
// it writes: beside a storm of failing partners, a lock of every failing
// endpoint's row before its update cost a WAL record each, batch after
// batch. When another instance wrote one of those rows since it was read
// (its update or insert did not match), recordHealth returns
// errHealthChanged, and the transaction runs again with locking: the
// rows read under their locks (in name order, so instances recording at
// once see each other's streaks, and lock in the same order), computed
// and written as they come. The version-checked update reaches its rows
// by key, in name order too, as its arrays are sorted.
//
// A success recorded beside another instance's uncommitted failure does
// not reset that failure's streak, as it would have after waiting for the
// lock: the breaker may open a batch sooner on an endpoint that fails for
// one instance and not for another.
func (s *Store) recordHealth(ctx context.Context, tx pgx.Tx, locking []string, locked map[string]Health,
	reading []string, read map[string]Health, versions map[string]string, byEndpoint map[string][]state.Result,
	apply HealthFunc) ([]HealthChange, error) {
	changes := make([]HealthChange, 0, len(locking)+len(reading))
	var succeeded []string
	var succeededAt []time.Time
	var checked []HealthChange // written if their versions still hold
	var vers []string
	for _, name := range reading {
		cur, ok := read[name]
		if !ok {
			cur = Health{Endpoint: name, State: postboxtype.BreakerClosed}
		}
		next := apply(cur, byEndpoint[name])
		at := next.LastSuccessAt
		quiet := next
		quiet.LastSuccessAt = cur.LastSuccessAt
		if !ok || quiet != cur {
			checked, vers = append(checked, HealthChange{Old: cur, New: next}), append(vers, versions[name])
			continue
		}
		changes = append(changes, HealthChange{Old: cur, New: cur})
		if at.Sub(cur.LastSuccessAt) >= healthQuietFor {
			succeeded, succeededAt = append(succeeded, name), append(succeededAt, at)
		}
	}
	written := make([]HealthChange, 0, len(locking))
	for _, name := range locking {
		cur, ok := locked[name]
		if !ok {
			cur = Health{Endpoint: name, State: postboxtype.BreakerClosed}
		}
		written = append(written, HealthChange{Old: cur, New: apply(cur, byEndpoint[name])})
	}
	b := &pgx.Batch{}
	var matched int64
	if len(checked) > 0 {
		queueCheckedHealthWrite(b, checked, vers).QueryRow(func(row pgx.Row) error { return row.Scan(&matched) })
	}
	if len(written) > 0 {
		queueHealthWrite(b, written)
	}
	if len(succeeded) > 0 {
		b.Queue(`
			UPDATE postbox.endpoint_health h SET last_success_at = greatest(h.last_success_at, s.at)
			FROM unnest($1::text[], $2::timestamptz[]) AS s(endpoint, at)
			WHERE h.endpoint = s.endpoint AND h.endpoint = ANY($1::text[]) -- by key: beside thousands of other rows, a join read them all`, succeeded, succeededAt)
	}
	if b.Len() > 0 {
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return nil, err
		}
	}
	if matched != int64(len(checked)) {
		return nil, errHealthChanged
	}
	return append(append(changes, checked...), written...), nil
}

// healthColumns are the arrays of new health rows that queueHealthWrite
// and queueCheckedHealthWrite store, in their statements' order ($1–$12).
func healthColumns(changes []HealthChange) []any {
	n := len(changes)
	names, states, fails, thresholds, cooldowns := make([]string, n), make([]string, n), make([]int32, n), make([]int32, n), make([]float64, n)
	opened, success, failure, paused := make([]*time.Time, n), make([]*time.Time, n), make([]*time.Time, n), make([]*time.Time, n)
	lastErr, probe := make([]*string, n), make([]*string, n)
	codes := make([]*int32, n)
	for i, c := range changes {
		h := c.New
		names[i], states[i], fails[i], thresholds[i] = h.Endpoint, string(h.State), int32(h.ConsecutiveFailures), int32(h.FailureThreshold)
		cooldowns[i] = h.Cooldown.Seconds()
		opened[i], success[i], failure[i], paused[i] = nullTime(h.OpenedAt), nullTime(h.LastSuccessAt), nullTime(h.LastFailureAt), nullTime(h.PausedUntil)
		lastErr[i], probe[i] = nullString(h.LastError), nullString(h.ProbeOwner)
		if h.LastStatusCode != 0 {
			code := int32(h.LastStatusCode)
			codes[i] = &code
		}
	}
	return []any{names, states, fails, thresholds, cooldowns, opened, success, failure, paused, lastErr, probe, codes}
}

// queueHealthWrite queues the statement that stores the new health rows
// (the statistics columns are the telemetry's and stay as they are).
func queueHealthWrite(b *pgx.Batch, changes []HealthChange) {
	b.Queue(`
		INSERT INTO postbox.endpoint_health AS h (endpoint, state, consecutive_failures, failure_threshold, cooldown_seconds,
		  opened_at, last_success_at, last_failure_at, paused_until, last_error, probe_owner, last_status_code)
		SELECT * FROM unnest($1::text[], $2::text[], $3::int4[], $4::int4[], $5::float8[], $6::timestamptz[], $7::timestamptz[],
		  $8::timestamptz[], $9::timestamptz[], $10::text[], $11::text[], $12::int4[])
		ON CONFLICT (endpoint) DO UPDATE SET
		  state = excluded.state, consecutive_failures = excluded.consecutive_failures,
		  failure_threshold = excluded.failure_threshold, cooldown_seconds = excluded.cooldown_seconds,
		  opened_at = excluded.opened_at, last_success_at = excluded.last_success_at,
		  last_failure_at = excluded.last_failure_at, paused_until = excluded.paused_until,
		  last_error = excluded.last_error, probe_owner = excluded.probe_owner,
		  probe_started_at = CASE WHEN excluded.probe_owner IS NULL THEN NULL ELSE h.probe_started_at END,
		  last_status_code = excluded.last_status_code`,
		healthColumns(changes)...)
}

// queueCheckedHealthWrite queues the statement that stores the new health
// rows of changes whose rows still have the versions vers ("" for a row
// that did not exist: it is inserted unless one is by then), as
// queueHealthWrite would, and returns how many it stored.
func queueCheckedHealthWrite(b *pgx.Batch, changes []HealthChange, vers []string) *pgx.QueuedQuery {
	return b.Queue(`
		WITH s AS (
		  SELECT * FROM unnest($1::text[], $2::text[], $3::int4[], $4::int4[], $5::float8[], $6::timestamptz[], $7::timestamptz[],
		    $8::timestamptz[], $9::timestamptz[], $10::text[], $11::text[], $12::int4[], $13::text[])
		    AS s(endpoint, state, consecutive_failures, failure_threshold, cooldown_seconds, opened_at, last_success_at,
		         last_failure_at, paused_until, last_error, probe_owner, last_status_code, version)
		),
		updated AS (
		  UPDATE postbox.endpoint_health h SET
		    state = s.state, consecutive_failures = s.consecutive_failures,
		    failure_threshold = s.failure_threshold, cooldown_seconds = s.cooldown_seconds,
		    opened_at = s.opened_at, last_success_at = s.last_success_at,
		    last_failure_at = s.last_failure_at, paused_until = s.paused_until,
		    last_error = s.last_error, probe_owner = s.probe_owner,
		    probe_started_at = CASE WHEN s.probe_owner IS NULL THEN NULL ELSE h.probe_started_at END,
		    last_status_code = s.last_status_code
		  FROM s
		  WHERE h.endpoint = s.endpoint AND h.endpoint = ANY($1::text[]) AND s.version <> '' AND h.xmin::text = s.version
		  RETURNING 1
		),
		inserted AS (
		  INSERT INTO postbox.endpoint_health (endpoint, state, consecutive_failures, failure_threshold, cooldown_seconds,
		    opened_at, last_success_at, last_failure_at, paused_until, last_error, probe_owner, last_status_code)
		  SELECT endpoint, state, consecutive_failures, failure_threshold, cooldown_seconds,
		    opened_at, last_success_at, last_failure_at, paused_until, last_error, probe_owner, last_status_code
		  FROM s WHERE s.version = ''
		  ON CONFLICT (endpoint) DO NOTHING
		  RETURNING 1
		)
		SELECT (SELECT count(*) FROM updated) + (SELECT count(*) FROM inserted)`,
		append(healthColumns(changes), vers)...)
}

// UnhealthyEndpoints returns the endpoints whose breaker is not closed or
// that a receiver has paused: the ones claims and attempts hold back.
func (s *Store) UnhealthyEndpoints(ctx context.Context) (map[string]Health, error) {
	rows, err := s.Pool.Query(ctx, selectHealthSQL+` WHERE state <> 'closed' OR paused_until > now()`)
	if err != nil {
		return nil, fmt.Errorf("read endpoint health: %w", err)
	}
	defer rows.Close()
	h, err := collectHealth(rows)
	if err != nil {
		return nil, fmt.Errorf("read endpoint health: %w", err)
	}
	return h, nil
}

// claimProbesSQL turns each candidate lane's open breaker whose cooldown has
// passed (or a half-open one whose prober is gone, or whose probe the
// candidate's retry says this instance never got) half-open for owner, and
// claims the one delivery that probes it: the earliest queued, due or not
// (by id: one queued since the breaker opened, not parked yet and so due,
// waits behind those queued before), or for an ordered endpoint the oldest. Only one instance can win a
// transition, so there is exactly one probe however many there are. A
// breaker with nothing queued is left as it is, to be probed once
// something is.
var claimProbesSQL = `
WITH cand AS (
  SELECT * FROM unnest($1::text[], $3::bool[], $4::bool[]) AS c(endpoint, retry, ordered)
),
probe AS (
  UPDATE postbox.endpoint_health h
  SET state = 'half_open', probe_owner = $2, probe_started_at = now()
  FROM cand
  WHERE h.endpoint = cand.endpoint
    AND ((h.state = 'open' AND h.opened_at + h.cooldown_seconds * interval '1 second' <= now())
      OR (h.state = 'half_open' AND h.probe_owner = $2 AND cand.retry)
      OR (h.state = 'half_open' AND NOT EXISTS (
            SELECT 1 FROM postbox.instances i WHERE i.id = h.probe_owner AND i.expires_at > now())))
    AND coalesce(h.paused_until, '-infinity') <= now()
    AND (EXISTS (SELECT 1 FROM postbox.deliveries d WHERE coalesce(d.lane, d.endpoint) = h.endpoint AND ` + queuedParked + `)
      OR EXISTS (SELECT 1 FROM postbox.deliveries d WHERE coalesce(d.lane, d.endpoint) = h.endpoint AND ` + queuedPending + `)
      OR EXISTS (SELECT 1 FROM postbox.deliveries d WHERE coalesce(d.lane, d.endpoint) = h.endpoint AND ` + queuedRetry + `))
  RETURNING h.endpoint, cand.ordered
),
first AS (
  SELECT c.id FROM probe CROSS JOIN LATERAL (
    SELECT u.id FROM (
      (SELECT d.id, d.next_attempt_at FROM postbox.deliveries d
       WHERE NOT probe.ordered AND coalesce(d.lane, d.endpoint) = probe.endpoint
         AND ` + queuedPending + `
       ORDER BY d.next_attempt_at, d.id LIMIT 1)
      UNION ALL
      (SELECT d.id, d.next_attempt_at FROM postbox.deliveries d
       WHERE NOT probe.ordered AND coalesce(d.lane, d.endpoint) = probe.endpoint
         AND ` + queuedRetry + `
       ORDER BY d.next_attempt_at, d.id LIMIT 1)
      UNION ALL
      (SELECT d.id, d.next_attempt_at FROM postbox.deliveries d -- parked (see Park)
       WHERE NOT probe.ordered AND coalesce(d.lane, d.endpoint) = probe.endpoint
         AND ` + queuedParked + `
       ORDER BY d.id LIMIT 1)
      UNION ALL
      (SELECT d.id, NULL FROM postbox.deliveries d
       WHERE probe.ordered AND d.endpoint = probe.endpoint AND d.status IN ('pending', 'failed') AND d.lease_owner IS NULL
       ORDER BY d.id LIMIT 1)
    ) u ORDER BY u.id LIMIT 1) c
),
next AS (
  SELECT d.id FROM postbox.deliveries d
  WHERE d.id IN (SELECT id FROM first) AND d.status IN ('pending', 'failed') AND d.lease_owner IS NULL
  FOR UPDATE SKIP LOCKED
)
UPDATE postbox.deliveries d
SET status = 'in_flight', lease_owner = $2, updated_at = now(), kept = false
FROM next, postbox.events e
WHERE d.id = next.id AND e.id = d.event_pk
RETURNING ` + claimedColumns

// ProbeCandidate is an endpoint whose breaker an instance may probe.
type ProbeCandidate struct {
	Endpoint string
	// Retry says the instance already holds the half-open state but its
	// probe claim found nothing.
	Retry   bool
	Ordered bool // probed with its oldest delivery
}

// ClaimProbes tries, in one statement, to make owner the prober of each
// candidate's breaker and to claim its probe delivery. It returns the
// probes won; a candidate is left out when another instance probes, the
// cooldown has not passed, or nothing is queued.
func (s *Store) ClaimProbes(ctx context.Context, owner string, cands []ProbeCandidate) ([]Claimed, error) {
	if len(cands) == 0 {
		return nil, nil
	}
	names := make([]string, len(cands))
	retry := make([]bool, len(cands))
	ordered := make([]bool, len(cands))
	for i, c := range cands {
		names[i], retry[i], ordered[i] = c.Endpoint, c.Retry, c.Ordered
	}
	out, err := s.claim(ctx, claimProbesSQL, names, owner, retry, ordered)
	if err != nil {
		return nil, fmt.Errorf("claim probes: %w", err)
	}
	return out, nil
}

// TakeTokens takes up to want tokens from endpoint's shared bucket, which
// refills at perSecond up to burst. It returns how many it took and how
// long until the next token.
func (s *Store) TakeTokens(ctx context.Context, endpoint string, want int, perSecond, burst float64) (int, time.Duration, error) {
	var granted int
	var left float64
	err := s.Pool.QueryRow(ctx, `
		WITH cur AS (
		  SELECT least($4::float8, coalesce(
		    (SELECT b.tokens + extract(epoch FROM now() - b.updated_at) * $3
		     FROM postbox.rate_buckets b WHERE b.endpoint = $1), $4)) AS avail
		)
		INSERT INTO postbox.rate_buckets AS b (endpoint, tokens, granted, updated_at)
		SELECT $1, avail - least($2, floor(avail)), least($2, floor(avail))::int, now() FROM cur
		ON CONFLICT (endpoint) DO UPDATE SET
		  tokens = least($4::float8, b.tokens + extract(epoch FROM now() - b.updated_at) * $3)
		           - least($2, floor(least($4::float8, b.tokens + extract(epoch FROM now() - b.updated_at) * $3))),
		  granted = least($2, floor(least($4::float8, b.tokens + extract(epoch FROM now() - b.updated_at) * $3)))::int,
		  updated_at = now()
		RETURNING granted, tokens`, endpoint, want, perSecond, burst).Scan(&granted, &left)
	if err != nil {
		return 0, 0, fmt.Errorf("take tokens for %s: %w", endpoint, err)
	}
	wait := time.Duration((1 - (left - math.Floor(left))) / perSecond * float64(time.Second))
	if left >= 1 {
		wait = 0
	}
	return granted, wait, nil
}

// Pause holds endpoint's deliveries until until (postboxtype.PauseIndefinite when
// zero), on every instance: claims skip the endpoint and attempts already
// claimed go back to the queue unspent. It replaces any pause the endpoint
// has, longer or shorter; a receiver's Retry-After later only extends it
// (see protect.Apply). Instances hear of it at once (NOTIFY).
func (s *Store) Pause(ctx context.Context, endpoint string, until time.Time) error {
	if until.IsZero() {
		until = postboxtype.PauseIndefinite
	}
	err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `
			INSERT INTO postbox.endpoint_health (endpoint, paused_until) VALUES ($1, $2)
			ON CONFLICT (endpoint) DO UPDATE SET paused_until = excluded.paused_until`, endpoint, until); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, WakeChannel, WakeHealth)
		return err
	})
	if err != nil {
		return fmt.Errorf("pause %s: %w", endpoint, err)
	}
	return nil
}

// Resume ends endpoint's pause, an operator's or a receiver's, and wakes
// every instance to claim its deliveries.
func (s *Store) Resume(ctx context.Context, endpoint string) error {
	err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `
			UPDATE postbox.endpoint_health SET paused_until = NULL
			WHERE endpoint = $1 AND paused_until IS NOT NULL`, endpoint); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, WakeChannel, WakeHealth)
		return err
	})
	if err != nil {
		return fmt.Errorf("resume %s: %w", endpoint, err)
	}
	return nil
}
