package relay_test

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/protect"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

func durp(d time.Duration) *config.Duration { c := config.Duration(d); return &c }
func intp(n int) *int                       { return &n }

// latencies returns commit-to-arrival times of the given receiver's requests.
func (tb *testBundle) latencies(t *testing.T, reqs []received) []time.Duration {
	t.Helper()
	committed := map[string]time.Time{}
	// A request can reach the receiver before the ingest that writes its
	// event commits: wait for every one's event.
	waitUntil(t, 10*time.Second, "the requests' events committed", func() bool {
		rows, err := tb.pool.Query(context.Background(), `SELECT event_id::text, committed_at FROM postbox.events WHERE committed_at IS NOT NULL`)
		require.NoError(t, err)
		for rows.Next() {
			var id string
			var at time.Time
			require.NoError(t, rows.Scan(&id, &at))
			committed[id] = at
		}
		require.NoError(t, rows.Err())
		for _, r := range reqs {
			if _, ok := committed[r.ID]; !ok {
				return false
			}
		}
		return true
	})
	var out []time.Duration
	for _, r := range reqs {
		if c, ok := committed[r.ID]; ok {
			out = append(out, r.At.Sub(c))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func pct(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted)-1)+0.5))]
}

// TestHangingEndpointDoesNotSlowTheOthers streams to nine healthy
// endpoints twice, the second time beside a tenth endpoint whose receiver
// holds every request until the test ends (its timeout, 60 s, is never
// reached). The claim is checked by what load cannot change: every event
// of the nine is delivered, once, while the hanging endpoint has exactly
// its max_in_flight attempts open and none of them has returned, so no
// healthy delivery waited for a hanging attempt, its timeout, or a slot it
// held. A shared worker pool or an ingest that waited for the dispatcher
// would leave the nine stuck behind it. The two runs' latencies are
// logged for comparison, not asserted: other packages' tests share the
// machine. It runs alone (not parallel) so that the figures compare.
func TestHangingEndpointDoesNotSlowTheOthers(t *testing.T) {
	tb := setup(t)
	healthy := newReceiver(t, nil)
	const hangCap, hangTimeout = 4, 60 * time.Second
	hang := make(chan struct{})
	var hangingNow, hangingDone atomic.Int32
	hanging := newReceiver(t, func(int, received) int {
		hangingNow.Add(1)
		defer hangingNow.Add(-1)
		<-hang
		hangingDone.Add(1)
		return http.StatusOK
	})
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(hang) }) }
	t.Cleanup(release)
	for i := range 9 {
		tb.endpoint(t, fmt.Sprintf("ok-%d", i), healthy.URL+fmt.Sprintf("/ok-%d", i), nil)
	}
	tb.endpoint(t, "hang", hanging.URL, func(ec *config.EndpointConfig) {
		ec.Timeout = durp(hangTimeout)
		ec.MaxInFlight = intp(hangCap)
		ec.MaxAttempts = intp(100)
	})
	tb.start(t, relay.Options{})

	// 50 events a second for 4 s, each its own transaction.
	stream := func(withHanging bool) []string {
		var ids []string
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for i := range 200 {
			<-tick.C
			ids = append(ids, tb.insert(t, outbox.Event{Endpoint: fmt.Sprintf("ok-%d", i%9)})...)
			if withHanging && i%4 == 0 {
				tb.insert(t, outbox.Event{Endpoint: "hang"})
			}
		}
		return ids
	}
	waitFor := func(ids []string) {
		waitUntil(t, 30*time.Second, "healthy deliveries", func() bool {
			got := healthy.byID()
			for _, id := range ids {
				if got[id] == 0 {
					return false
				}
			}
			return true
		})
	}
	idsA := stream(false)
	waitFor(idsA)
	nA := len(healthy.requests())
	latA := tb.latencies(t, healthy.requests())

	// Saturate the hanging endpoint before the second run.
	hangEvents := make([]outbox.Event, 2*hangCap)
	for i := range hangEvents {
		hangEvents[i] = outbox.Event{Endpoint: "hang"}
	}
	tb.insert(t, hangEvents...)
	waitUntil(t, 30*time.Second, "the hanging endpoint's attempts to fill its cap", func() bool { return hangingNow.Load() == hangCap })

	idsB := stream(true)
	waitFor(idsB)
	reqsB := healthy.requests()[nA:]
	latB := tb.latencies(t, reqsB)
	open, done, tried := hangingNow.Load(), hangingDone.Load(), hanging.count()

	t.Logf("healthy endpoints alone:        p50 %s  p90 %s  p99 %s", pct(latA, .5), pct(latA, .9), pct(latA, .99))
	t.Logf("with one endpoint hanging:      p50 %s  p90 %s  p99 %s", pct(latB, .5), pct(latB, .9), pct(latB, .99))
	require.Len(t, reqsB, len(idsB), "the nine get each event once")
	require.Len(t, latB, len(idsB))
	require.EqualValues(t, hangCap, open, "the hanging endpoint's cap stayed full through the second run")
	require.Zero(t, done, "no hanging attempt returned: the nine waited for none")
	require.Equal(t, hangCap, tried, "attempts beyond the cap wait in the hanging endpoint's own queue")
	require.Less(t, pct(latB, 1), hangTimeout, "no healthy delivery waited for the hanging endpoint's timeout")
	var waiting int
	require.NoError(t, tb.pool.QueryRow(context.Background(), `SELECT count(*) FROM postbox.deliveries WHERE endpoint = 'hang' AND status = 'pending'`).Scan(&waiting))
	require.Greater(t, waiting, 0, "the hanging endpoint had more events than its cap")
	release()
}

// TestBreakerProbesOnceAcrossInstances runs two instances against an
// endpoint that fails: the breaker opens after the threshold, each
// half-open period sends exactly one probe (whichever instance wins it),
// the cooldown doubles up to its cap, and once the endpoint recovers the
// held events are delivered with their attempts unspent.
func TestBreakerProbesOnceAcrossInstances(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	var healthy atomic.Bool
	rc := newReceiver(t, func(int, received) int {
		if healthy.Load() {
			return http.StatusOK
		}
		return http.StatusInternalServerError
	})
	cooldown, maxCooldown := 300*time.Millisecond, time.Second
	tb.endpoint(t, "flaky", rc.URL, func(ec *config.EndpointConfig) {
		ec.FailureThreshold = intp(3)
		ec.Cooldown = durp(cooldown)
		ec.MaxCooldown = durp(maxCooldown)
		ec.MaxAttempts = intp(1000)
		ec.BackoffBase = durp(10 * time.Millisecond)
		ec.BackoffCap = durp(20 * time.Millisecond)
	})
	tb.start(t, relay.Options{InstanceID: "first"})
	tb.startStandby(t, relay.Options{InstanceID: "second"})
	ctx := context.Background()
	breaker := func() (string, time.Duration) {
		var s string
		var cd float64
		err := tb.pool.QueryRow(ctx, `SELECT state, cooldown_seconds FROM postbox.endpoint_health WHERE endpoint = 'flaky'`).Scan(&s, &cd)
		if err != nil {
			return "", 0
		}
		return s, time.Duration(cd * float64(time.Second))
	}

	first := tb.insert(t, func() []outbox.Event {
		evs := make([]outbox.Event, 30)
		for i := range evs {
			evs[i] = outbox.Event{Endpoint: "flaky"}
		}
		return evs
	}()...)
	waitUntil(t, 20*time.Second, "the breaker to open", func() bool { s, _ := breaker(); return s == "open" })
	// Attempts in flight when it opened finish and are recorded before the
	// probes are counted.
	waitUntil(t, 20*time.Second, "no attempt in flight", func() bool {
		var n int
		require.NoError(t, tb.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM postbox.deliveries WHERE endpoint = 'flaky' AND status = 'in_flight') +
			(SELECT count(*) FROM postbox.events_under_way WHERE endpoint = 'flaky')`).Scan(&n))
		return n == 0
	})
	openedAt := time.Now()
	before := rc.count()

	// Events written while the breaker is open wait. The streaming
	// instance learns of a breaker the other one opened at its next claim
	// cycle (a sweep at the latest, its view at most
	// protect.RefreshIntervalDefault old); until then its fast path may
	// still try the endpoint once.
	time.Sleep(time.Duration(tb.cfg.SweepInterval) + protect.RefreshIntervalDefault)
	held := tb.insert(t, outbox.Event{Endpoint: "flaky"}, outbox.Event{Endpoint: "flaky"})
	// Let it probe and fail until the cooldown has reached its cap (each
	// cooldown is shortened by up to a quarter at random).
	waitUntil(t, 30*time.Second, "the cooldown to double up to its cap", func() bool {
		_, cd := breaker()
		return cd >= maxCooldown*3/4 && cd <= maxCooldown && time.Since(openedAt) > 4*time.Second
	})
	probes := rc.requests()[before:]
	require.NotEmpty(t, probes)
	// One probe per half-open period: consecutive probes are at least the
	// (growing, jittered) cooldown apart, never two at once.
	shortest := cooldown * 3 / 4
	for i := 1; i < len(probes); i++ {
		gap := probes[i].At.Sub(probes[i-1].At)
		require.GreaterOrEqual(t, gap, shortest*9/10, "probe %d came %s after the previous one", i, gap)
	}
	require.LessOrEqual(t, len(probes), 1+int(time.Since(openedAt)/shortest), "no more probes than half-open periods")
	for _, id := range held {
		d := tb.delivery(t, id)
		require.Equal(t, postboxtype.DeliveryPending, d.Status, "held, not attempted, while open")
		require.Zero(t, d.Attempts)
	}

	healthy.Store(true)
	waitUntil(t, 30*time.Second, "the breaker to close", func() bool { s, _ := breaker(); return s == "closed" })
	tb.waitSettled(t, len(first)+len(held), 30*time.Second)
	for _, id := range held {
		d := tb.delivery(t, id)
		require.Equal(t, postboxtype.DeliveryDelivered, d.Status)
		require.Equal(t, 1, d.Attempts, "waiting while open spent no attempts")
	}
	s, cd := breaker()
	require.Equal(t, "closed", s)
	require.Equal(t, cooldown, cd, "closing resets the cooldown")
	require.Contains(t, tb.logs.String(), "circuit breaker opened")
	require.Equal(t, 1, strings.Count(tb.logs.String(), "circuit breaker closed"), "each transition is logged once")
}

// TestRateLimitSpacesDeliveries: 200 events to an endpoint limited to 20/s
// arrive no faster than the bucket allows, and none fails.
func TestRateLimitSpacesDeliveries(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	rate := config.Rate{N: 20, Per: time.Second}
	tb.endpoint(t, "limited", rc.URL, func(ec *config.EndpointConfig) { ec.RateLimit = &rate })
	tb.start(t, relay.Options{})
	evs := make([]outbox.Event, 200)
	for i := range evs {
		evs[i] = outbox.Event{Endpoint: "limited"}
	}
	tb.insert(t, evs...)
	tb.waitSettled(t, 200, time.Minute)
	require.Equal(t, map[postboxtype.DeliveryState]int{postboxtype.DeliveryDelivered: 200}, tb.deliveries(t), "none failed")
	reqs := rc.requests()
	require.Len(t, reqs, 200)
	const burst = 20.0 // one second's worth at 20/s: the limiter's burst
	// Token bucket: any k consecutive sends span at least (k-burst-1)/rate.
	// They are timed where they arrive, which a loaded machine (the race
	// detector, parallel tests) may delay by a hundred milliseconds or so:
	// windows of at least 60 sends (two seconds and more), with a quarter
	// second of slack, still catch a limiter that lets too much through.
	const slack = 250 * time.Millisecond
	for i := range reqs {
		for j := i + int(burst) + 40; j < len(reqs); j += 10 {
			k := float64(j - i + 1)
			min := time.Duration((k-burst-1)/rate.PerSecond()*float64(time.Second)) - slack
			require.GreaterOrEqual(t, reqs[j].At.Sub(reqs[i].At), min, "requests %d..%d", i, j)
		}
	}
	span := reqs[len(reqs)-1].At.Sub(reqs[0].At)
	t.Logf("200 events at 20/s (burst %.0f) took %s", burst, span)
}

// TestRetryAfterSetsNextAttempt: 429 with seconds and 503 with an HTTP
// date both schedule the retry (and pause the endpoint) as asked.
func TestRetryAfterSetsNextAttempt(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	srv := newReceiverWithHeaders(t, func(r received) (int, http.Header) {
		if r.Path == "/seconds" {
			return http.StatusTooManyRequests, http.Header{"Retry-After": {"120"}}
		}
		return http.StatusServiceUnavailable, http.Header{"Retry-After": {time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)}}
	})
	tb.endpoint(t, "seconds", srv.URL+"/seconds", nil)
	tb.endpoint(t, "date", srv.URL+"/date", nil)
	tb.start(t, relay.Options{})
	ids := tb.insert(t, outbox.Event{Endpoint: "seconds"}, outbox.Event{Endpoint: "date"})
	waitUntil(t, 20*time.Second, "both attempts recorded", func() bool {
		return tb.attempts(t, ids[0]) == 1 && tb.attempts(t, ids[1]) == 1
	})
	now := time.Now()
	d := tb.delivery(t, ids[0])
	require.Equal(t, postboxtype.DeliveryFailed, d.Status)
	require.InDelta(t, 120, d.NextAttempt.Sub(now).Seconds(), 5)
	d = tb.delivery(t, ids[1])
	require.Equal(t, postboxtype.DeliveryFailed, d.Status)
	require.InDelta(t, 90, d.NextAttempt.Sub(now).Seconds(), 5)
	var paused time.Time
	require.NoError(t, tb.pool.QueryRow(context.Background(), `SELECT paused_until FROM postbox.endpoint_health WHERE endpoint = 'seconds'`).Scan(&paused))
	require.InDelta(t, 120, paused.Sub(now).Seconds(), 5, "the whole endpoint waits, not just the event")
}

// TestBodyRuleFailureIsReadable: an affiliate network answering 200 with
// success=false fails the endpoint's success rule.
func TestBodyRuleFailureIsReadable(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	srv := newReceiverWithHeaders(t, func(received) (int, http.Header) { return http.StatusOK, nil })
	srv.mu.Lock()
	srv.body = "success=false; err_msg=click not found"
	srv.mu.Unlock()
	tb.endpoint(t, "aff", srv.URL, func(ec *config.EndpointConfig) {
		ec.Success = &config.Success{Status: []int{200}, BodyContains: "success=true"}
		ec.MaxAttempts = intp(2)
		ec.BackoffBase = durp(10 * time.Millisecond)
	})
	tb.start(t, relay.Options{})
	ids := tb.insert(t, outbox.Event{Endpoint: "aff"})
	tb.waitSettled(t, 1, 20*time.Second)
	d := tb.delivery(t, ids[0])
	require.Equal(t, postboxtype.DeliveryDeadLetter, d.Status)
	require.Equal(t, 2, d.Attempts)
	require.Equal(t, 200, d.LastStatus)
	require.Equal(t, `max_attempts (2) exhausted: body rule: http 200 response lacks "success=true"`, d.LastError)
	require.Equal(t, "success=false; err_msg=click not found", d.LastResponse)
}

// TestOrderedEndpointKeepsCommitOrder: events of an ordered endpoint are
// delivered one at a time in commit order, a failure holding back the
// ones behind it until its retry succeeds.
func TestOrderedEndpointKeepsCommitOrder(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	var failedOnce atomic.Bool
	var inFlight, maxInFlight atomic.Int32
	rc := newReceiver(t, func(_ int, r received) int {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		if n > maxInFlight.Load() {
			maxInFlight.Store(n)
		}
		time.Sleep(5 * time.Millisecond)
		if strings.Contains(string(r.Body), `"n": 3`) && failedOnce.CompareAndSwap(false, true) {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	tb.endpoint(t, "ledger", rc.URL, func(ec *config.EndpointConfig) {
		ec.Ordered = new(bool)
		*ec.Ordered = true
		ec.BackoffBase = durp(100 * time.Millisecond)
	})
	other := newReceiver(t, nil)
	tb.endpoint(t, "other", other.URL, nil)
	tb.start(t, relay.Options{})
	var ids []string
	for i := 1; i <= 10; i++ {
		ids = append(ids, tb.insert(t, outbox.Event{Endpoint: "ledger", Payload: []byte(fmt.Sprintf(`{"n": %d}`, i))})...)
		tb.insert(t, outbox.Event{Endpoint: "other"})
	}
	tb.waitSettled(t, 20, 30*time.Second)
	var delivered []string
	for _, r := range rc.requests() {
		if len(delivered) == 0 || delivered[len(delivered)-1] != r.ID {
			delivered = append(delivered, r.ID)
		}
	}
	require.Equal(t, ids, delivered, "delivery order is commit order, the retry in its place")
	require.Equal(t, 11, rc.count(), "ten events, one retried")
	require.EqualValues(t, 1, maxInFlight.Load(), "one at a time")
	require.Equal(t, 10, other.count(), "the other endpoint was not held back")
}

// TestOneHostHangingDoesNotHoldAnotherUnderOneEndpoint: an endpoint
// configured with settings only takes each row's URL, and each host gets
// its own in-flight lane and breaker. One host hangs with the endpoint's
// max_in_flight attempts open, another fails until its breaker opens, and
// a third, under the same endpoint, still gets every event at once.
// Keyed by the endpoint's name, the hanging host's attempts would hold
// the third's events until the 60 s timeout.
func TestOneHostHangingDoesNotHoldAnotherUnderOneEndpoint(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	const capacity, threshold = 2, 3
	hang := make(chan struct{})
	var hangingNow atomic.Int32
	hanging := newReceiver(t, func(int, received) int {
		hangingNow.Add(1)
		defer hangingNow.Add(-1)
		<-hang
		return http.StatusOK
	})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(hang) }) })
	failing := newReceiver(t, func(int, received) int { return http.StatusInternalServerError })
	healthy := newReceiver(t, nil)
	tb.cfg.Endpoints = map[string]config.EndpointConfig{"partners": {
		MaxInFlight: intp(capacity), Timeout: durp(60 * time.Second), MaxAttempts: intp(100),
		FailureThreshold: intp(threshold), Cooldown: durp(time.Hour),
	}}
	require.NoError(t, tb.cfg.Validate())
	tb.start(t, relay.Options{})
	events := func(n int, url string) []outbox.Event {
		evs := make([]outbox.Event, n)
		for i := range evs {
			evs[i] = outbox.Event{Endpoint: "partners", URL: url + "/pb"}
		}
		return evs
	}

	tb.insert(t, events(2*capacity, hanging.URL)...)
	waitUntil(t, 30*time.Second, "the hanging host to hold the endpoint's max_in_flight", func() bool { return hangingNow.Load() == capacity })
	tb.insert(t, events(2*threshold, failing.URL)...)
	waitUntil(t, 30*time.Second, "the failing host's breaker to open", func() bool {
		var st string
		_ = tb.pool.QueryRow(context.Background(), `SELECT state FROM postbox.endpoint_health WHERE endpoint = $1`,
			"partners → "+strings.TrimPrefix(failing.URL, "http://")).Scan(&st)
		return st == "open"
	})
	ids := tb.insert(t, events(10, healthy.URL)...)
	waitUntil(t, 30*time.Second, "the healthy host's events", func() bool { return len(healthy.byID()) == len(ids) })

	require.EqualValues(t, capacity, hangingNow.Load(), "the hanging host still holds its lane")
	require.Equal(t, capacity, hanging.count(), "its other events wait in its own lane")
	// The breaker opens at the threshold; attempts already in flight then
	// still count.
	require.GreaterOrEqual(t, failing.count(), threshold)
	require.LessOrEqual(t, failing.count(), threshold+capacity-1, "the open breaker holds the failing host's other events")
	// A delivery can arrive before the ingest that writes it commits.
	var lanes []string
	waitUntil(t, 10*time.Second, "a lane per host", func() bool {
		rows, err := tb.pool.Query(context.Background(), `SELECT DISTINCT lane FROM postbox.deliveries WHERE endpoint = 'partners' ORDER BY 1`)
		require.NoError(t, err)
		lanes, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return len(lanes) == 3
	})
}
