package bench

import (
	"context"
	"fmt"
	"time"
)

// DeadDefault is how many dead endpoints the dead scenario adds.
const DeadDefault = 10000

// DeadResult is the dead scenario's: the latency scenario run twice, once
// alone and once beside dead endpoints whose breakers are open and whose
// deliveries wait on them.
type DeadResult struct {
	Dead int `json:"dead_endpoints"`
	// ParkSeconds is how long a relay took to park the dead endpoints'
	// deliveries (store.Park) before the measured run.
	ParkSeconds float64        `json:"park_seconds"`
	Alone       *LatencyResult `json:"without_dead_endpoints"`
	Beside      *LatencyResult `json:"beside_dead_endpoints"`
}

// dead measures the cost of dead endpoints to the healthy ones.
func (e *env) dead(ctx context.Context, o Options) (*DeadResult, error) {
	res := &DeadResult{Dead: o.Dead}
	var err error
	if res.Alone, err = e.latency(ctx, o, false); err != nil {
		return nil, err
	}
	fmt.Fprintf(e.log, "bench: dead, %d endpoints with open breakers and three deliveries waiting each\n", o.Dead)
	if err := e.seedDead(ctx, o.Dead); err != nil {
		return nil, err
	}
	// Breakers that opened a few sweeps ago have their deliveries parked:
	// measure that state, after timing how long a relay takes to reach it.
	if res.ParkSeconds, err = e.parkDead(ctx); err != nil {
		return nil, err
	}
	if res.Beside, err = e.latency(ctx, o, false); err != nil {
		return nil, err
	}
	e.truncate(ctx, true)
	return res, nil
}

// parkDead runs a relay until the dead endpoints' deliveries are parked
// and returns how long that took.
func (e *env) parkDead(ctx context.Context) (float64, error) {
	start := time.Now()
	if err := e.startRelay(ctx); err != nil {
		return 0, err
	}
	err := waitFor(ctx, 5*time.Minute, 100*time.Millisecond, func() (bool, error) {
		var left int
		err := e.pool.QueryRow(ctx, `SELECT count(*) FROM postbox.deliveries
			WHERE endpoint LIKE 'dead-%' AND status = 'failed' AND next_attempt_at < 'infinity'`).Scan(&left)
		return left == 0, err
	})
	took := time.Since(start).Seconds()
	e.stopRelay()
	if err != nil {
		return 0, fmt.Errorf("park the dead endpoints' deliveries: %w", err)
	}
	fmt.Fprintf(e.log, "bench: dead, a relay parked their deliveries in %.1f s\n", took)
	return took, nil
}

// seedDead gives n endpoints (row URLs to a closed port) three failed
// deliveries each and a breaker opened now with an hour's cooldown, as
// partners that went away leave them.
func (e *env) seedDead(ctx context.Context, n int) error {
	if err := e.ensureSchema(ctx); err != nil {
		return err
	}
	_, err := e.pool.Exec(ctx, `
		WITH ev AS (
		  INSERT INTO postbox.events (event_id, endpoint, url, payload, created_at)
		  SELECT gen_random_uuid(), format('dead-%s', i), 'http://127.0.0.1:9/gone', '{}', now()
		  FROM generate_series(1, $1) i, generate_series(1, 3)
		  RETURNING id, endpoint)
		INSERT INTO postbox.deliveries (event_pk, endpoint, status, attempt_count, last_error)
		SELECT id, endpoint, 'failed', 1, 'connection refused' FROM ev`, n)
	if err == nil {
		_, err = e.pool.Exec(ctx, `
			INSERT INTO postbox.endpoint_health (endpoint, state, consecutive_failures, opened_at, cooldown_seconds)
			SELECT format('dead-%s', i), 'open', 5, now(), 3600 FROM generate_series(1, $1) i`, n)
	}
	if err == nil {
		_, err = e.pool.Exec(ctx, `VACUUM ANALYZE postbox.deliveries, postbox.events, postbox.endpoint_health`)
	}
	if err != nil {
		return fmt.Errorf("seed dead endpoints: %w", err)
	}
	return nil
}
