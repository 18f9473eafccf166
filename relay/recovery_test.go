package relay_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay"
	"github.com/postbox-relay/postbox/relay/internal/service"
	"github.com/postbox-relay/postbox/relay/ops"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// A claim whose statement committed but whose answer was lost (the
// connection broke on the way back) leaves deliveries in flight under a
// live instance that does not hold them: nothing would ever attempt or
// release them. The instance's sweep finds them and returns them to the
// queue.
func TestClaimsWhoseAnswerWasLostAreRescued(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.endpoint(t, "p", rc.URL, nil)
	r := tb.start(t, relay.Options{})
	ctx := context.Background()

	// Queue the deliveries while the endpoint is paused, then mark them
	// claimed by this instance a minute ago, as a lost claim leaves them.
	require.NoError(t, ops.Pause(ctx, tb.pool, "p", time.Now().Add(time.Hour)))
	time.Sleep(time.Second) // a few sweeps: the relay's view of the pause is refreshed on each
	ids := tb.insert(t, outbox.Event{Endpoint: "p"}, outbox.Event{Endpoint: "p"}, outbox.Event{Endpoint: "p"})
	waitUntil(t, 30*time.Second, "the deliveries queued", func() bool { return tb.deliveries(t)[postboxtype.DeliveryPending] == 3 })
	tag, err := tb.pool.Exec(ctx, `UPDATE postbox.deliveries SET status = 'in_flight', lease_owner = $1, updated_at = now() - interval '1 minute'`, r.InstanceID())
	require.NoError(t, err)
	require.EqualValues(t, 3, tag.RowsAffected())
	require.NoError(t, ops.Resume(ctx, tb.pool, "p"))

	tb.waitSettled(t, 3, 30*time.Second)
	got := rc.byID()
	for _, id := range ids {
		require.Equal(t, 1, got[id], "delivered once: %s", id)
	}
	require.Contains(t, tb.logs.String(), "lost track of")
}

// Deliveries this instance holds are not rescued however long their
// attempt takes: only those it has lost track of.
func TestClaimsInFlightAreNotRescued(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	release := make(chan struct{})
	rc := newReceiver(t, func(int, received) int { <-release; return 200 })
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	tb.endpoint(t, "slow", rc.URL, nil)
	r := tb.start(t, relay.Options{})
	ctx := context.Background()
	ids := tb.insert(t, outbox.Event{Endpoint: "slow"})
	waitUntil(t, 30*time.Second, "the attempt under way", func() bool { return rc.count() == 1 })
	// Make the claim look old; the sweep runs every 200 ms. The attempt
	// starts while the ingest writes the delivery: wait for its row.
	waitUntil(t, 10*time.Second, "the delivery in flight, committed", func() bool {
		tag, err := tb.pool.Exec(ctx, `UPDATE postbox.deliveries SET updated_at = now() - interval '1 minute' WHERE lease_owner = $1`, r.InstanceID())
		require.NoError(t, err)
		return tag.RowsAffected() == 1
	})
	time.Sleep(time.Second)
	close(release)
	tb.waitSettled(t, 1, 30*time.Second)
	require.Equal(t, 1, rc.byID()[ids[0]], "attempted once")
	require.NotContains(t, tb.logs.String(), "lost track of")
}

// TestEachDatabaseFaultIsRetriedAsTheFirst makes the database read-only
// three times, each until the relay has failed to start a replication
// session a few times (its retries back off), then writable again until
// it streams and delivers an event. The first retry after a session that
// worked waits as the first retry of all: each fault is a new incident,
// not more failures of the process's life. (Counted for life, the
// retries reached their cap after a handful of faults, however far
// apart, and every later fault then held the stream back for as long.)
func TestEachDatabaseFaultIsRetriedAsTheFirst(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.endpoint(t, "p", rc.URL, nil)
	r := tb.start(t, relay.Options{})
	const faults = 3
	for fault := 1; fault <= faults; fault++ {
		tb.insert(t, outbox.Event{Endpoint: "p"})
		tb.waitSettled(t, fault, 60*time.Second)
		waitUntil(t, 60*time.Second, "the relay streaming", r.Streaming)
		ended := len(sessionEnds(t, tb.logs.String()))
		tb.readOnly(t, true)
		waitUntil(t, 60*time.Second, "three failed tries to stream", func() bool {
			return len(sessionEnds(t, tb.logs.String())) >= ended+3
		})
		tb.readOnly(t, false)
	}
	tb.insert(t, outbox.Event{Endpoint: "p"})
	tb.waitSettled(t, faults+1, 60*time.Second)
	rc.requireEachOnce(t, faults+1)

	firsts := 0
	after := false // the line before was "streaming"
	for _, l := range sessionLog(t, tb.logs.String()) {
		switch {
		case l.Message == "streaming":
			after = true
		case l.Message == "replication session ended" && after:
			after = false
			firsts++
			require.LessOrEqual(t, l.RetryIn, float64(service.RetryBaseDefault/time.Millisecond),
				"the first retry after the session streamed number %d", firsts)
		}
	}
	require.Equal(t, faults, firsts, "each fault ended a session that streamed")
}

// logLine is a line of the relay's log, as far as the tests read it.
type logLine struct {
	Message string  `json:"message"`
	RetryIn float64 `json:"retry_in"` // ms
}

// sessionLog returns the replication sessions' starts ("streaming") and
// ends in error ("replication session ended"), in order.
func sessionLog(t *testing.T, logs string) []logLine {
	t.Helper()
	var out []logLine
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, `"message":"streaming"`) && !strings.Contains(line, `"message":"replication session ended"`) {
			continue
		}
		var l logLine
		require.NoError(t, json.Unmarshal([]byte(line), &l))
		out = append(out, l)
	}
	return out
}

// sessionEnds returns the ends in error of sessionLog.
func sessionEnds(t *testing.T, logs string) []logLine {
	var out []logLine
	for _, l := range sessionLog(t, logs) {
		if l.Message != "streaming" {
			out = append(out, l)
		}
	}
	return out
}

// Start waits out a database that is read-only for a while (a failover
// in progress): it retries with backoff, then starts.
func TestStartWaitsOutAReadOnlyDatabase(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.endpoint(t, "p", rc.URL, nil)
	ctx := context.Background()
	db := tb.pool.Config().ConnConfig.Database
	readOnly := func(on string) {
		_, err := tb.pool.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` SET default_transaction_read_only = `+on)
		require.NoError(t, err)
	}
	readOnly("on")
	t.Cleanup(func() { readOnly("off") })

	r := tb.newRelay(t, relay.Options{})
	started := make(chan error, 1)
	go func() { started <- r.Start(ctx) }()
	waitUntil(t, 30*time.Second, "a retry logged", func() bool { return strings.Contains(tb.logs.String(), "database not ready") })
	select {
	case err := <-started:
		t.Fatalf("Start returned while the database was read-only: %v", err)
	default:
	}
	readOnly("off")
	// The relay's sessions took the setting when they connected.
	_, err := tb.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, db)
	require.NoError(t, err)
	tb.pool.Reset()
	select {
	case err := <-started:
		require.NoError(t, err)
	case <-time.After(60 * time.Second):
		t.Fatal("Start did not return once the database was writable")
	}
	ids := tb.insert(t, outbox.Event{Endpoint: "p"})
	waitUntil(t, 30*time.Second, "the delivery", func() bool { return rc.byID()[ids[0]] == 1 })
}
