package telemetry_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/telemetry"
)

// TestAttemptsKeptOnDeliveries: a first attempt that delivered is kept on
// its delivery's row (migration 026), not in postbox.attempts, and every
// reader of attempts finds it there as if it were a row: the event's
// story, the endpoint's recent attempts (in start order among the rows),
// its exact percentiles and the per-minute counts, with its start its
// delivered_at less its response time. A delivered row without the mark
// (its attempts are rows) is no attempt of its own.
func TestAttemptsKeptOnDeliveries(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	pk, id := event(t, pool, "k", ago(time.Hour), time.Hour, "")
	var inline int64
	var deliveredAt time.Time
	require.NoError(t, pool.QueryRow(ctx, `
		INSERT INTO postbox.deliveries (event_pk, endpoint, status, attempt_count, delivered_at, last_status_code,
		  last_response_ms, last_response, attempt_target, attempted_by)
		VALUES ($1, 'k', 'delivered', 1, now() - interval '2 minutes', 200, 7.5, 'ok', 'https://example.com/k', 'i2')
		RETURNING id, delivered_at`, pk).Scan(&inline, &deliveredAt))
	// Outside the window: not in the percentiles.
	old, _ := event(t, pool, "k", ago(26*time.Hour), 26*time.Hour, "")
	exec(t, pool, `
		INSERT INTO postbox.deliveries (event_pk, endpoint, status, attempt_count, delivered_at, last_status_code,
		  last_response_ms, attempt_target, attempted_by)
		VALUES ($1, 'k', 'delivered', 1, now() - interval '25 hours', 200, 99999, 'https://example.com/k', 'i2')`, old)
	// Retried: its attempts are rows, its delivered row no attempt.
	retriedPK, _ := event(t, pool, "k", ago(time.Hour), time.Hour, "")
	retried := delivery(t, pool, retriedPK, "k", "delivered", 2, nil)
	attempt(t, pool, retried, "k", 1, 5*time.Minute, 503, "failed", "http 503")
	attempt(t, pool, retried, "k", 2, time.Minute, 200, "delivered", "")

	stories, err := telemetry.LoadEvent(ctx, pool, id)
	require.NoError(t, err)
	require.Len(t, stories, 1)
	require.Len(t, stories[0].Deliveries, 1)
	as := stories[0].Deliveries[0].Attempts
	require.Len(t, as, 1, "the attempt kept on the delivery")
	a := as[0]
	require.Equal(t, 1, a.Attempt)
	require.Equal(t, 200, *a.StatusCode)
	require.Equal(t, 7.5, a.DurationMS)
	require.Equal(t, "ok", a.Response)
	require.Equal(t, "https://example.com/k", a.Target)
	require.Equal(t, "i2", a.Instance)
	require.Empty(t, a.Error)
	require.WithinDuration(t, deliveredAt.Add(-7500*time.Microsecond), a.StartedAt, time.Microsecond)

	rows, err := telemetry.RecentAttempts(ctx, pool, "k", 10)
	require.NoError(t, err)
	var got []int64
	for _, r := range rows {
		got = append(got, r.DeliveryID)
	}
	require.Len(t, rows, 4, "the old one too: recent attempts have no window")
	require.Equal(t, []int64{retried, inline, retried}, got[:3], "newest first, rows and kept alike")
	require.Equal(t, 99999.0, rows[3].DurationMS)
	require.Equal(t, id, rows[1].EventID)
	require.Equal(t, "i2", rows[1].Instance)
	// The view (the story's) and attemptsOnDeliveries (the others') spell
	// the same columns twice: they must read a kept attempt alike.
	require.Equal(t, a, rows[1].AttemptRecord, "postbox.all_attempts and attemptsOnDeliveries agree")
	rows, err = telemetry.RecentAttempts(ctx, pool, "k", 1)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Equal(t, 2, rows[0].Attempt)

	eps, err := telemetry.LoadEndpoints(ctx, pool, "k")
	require.NoError(t, err)
	require.Len(t, eps, 1)
	require.EqualValues(t, 3, eps[0].SampleCount, "two rows and the kept one in the window")
	require.Equal(t, 12.5, *eps[0].P50MS)
	require.Equal(t, 12.5, *eps[0].P99MS, "not the kept one 25 hours old")

	minutes, err := telemetry.DeliveriesPerMinute(ctx, pool, 10*time.Minute)
	require.NoError(t, err)
	delivered, failed := 0, 0
	for _, m := range minutes {
		delivered += m.Delivered
		failed += m.Failed
	}
	require.Equal(t, 2, delivered, "the kept attempt and the retry's")
	require.Equal(t, 1, failed)
}

// TestAttemptsKeptOnDeliveriesAreReadByIndex: the readers of attempts
// reach those kept on deliveries through an index, by endpoint or by
// delivered_at, never by reading postbox.deliveries whole: 100,000 kept
// two hours ago and a few now. Two hours puts the 100,000 inside the
// percentiles' day, so reading that day by delivered_at costs them all and
// the endpoint's index is the only cheap plan (two days ago, both were
// cheap, and ANALYZE's sample decided between them), and outside the
// hour that the count per minute reads by delivered_at.
func TestAttemptsKeptOnDeliveriesAreReadByIndex(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	kept := `status = 'delivered', last_response_ms = 5, attempt_target = 'https://example.com/big', attempted_by = 'i1', delivered_at = `
	deliveries(t, pool, "big", 100000, kept+`now() - interval '2 hours'`)
	deliveries(t, pool, "big", 10, kept+`now()`)
	deliveries(t, pool, "small", 10, kept+`now()`)
	exec(t, pool, `ANALYZE postbox.deliveries`)
	for _, c := range []struct {
		name, sql, index string
		args             []any
	}{
		{"recent attempts", telemetry.RecentAttemptsSQL, "deliveries_first_attempt", []any{"small", 50}},
		{"exact percentiles", telemetry.ExactPercentilesSQL, "deliveries_first_attempt", []any{telemetry.Window.Seconds(), []string{"small"}}},
		{"per minute", telemetry.PerMinuteSQL, "deliveries_delivered_at", []any{time.Hour.Seconds()}},
	} {
		plan := explain(t, pool, false, c.sql, c.args...)
		require.NotContains(t, plan, "Seq Scan on deliveries", "%s:\n%s", c.name, plan)
		require.Regexp(t, "Index Scan (Backward )?using "+c.index, plan, "%s:\n%s", c.name, plan)
	}
}
