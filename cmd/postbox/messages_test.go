package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/pgtest"
)

// TestReplayLeavesOutMessagesWhileTheyAreOff: `postbox replay` under a
// configuration with outbox_messages off does not enqueue a messages_off
// dead letter (a relay would refuse it again) and says why; with them on it
// enqueues it.
func TestReplayLeavesOutMessagesWhileTheyAreOff(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	off := writeConfig(t, dbURL, "")
	code, out, errOut := postbox(t, "migrate", "--config", off)
	require.Equal(t, exitOK, code, out+errOut)
	_, err := pool.Exec(context.Background(), `
		WITH e AS (INSERT INTO postbox.events (event_id, endpoint, payload, created_at, message)
		           VALUES (gen_random_uuid(), 'p', '{}', now(), true) RETURNING id)
		INSERT INTO postbox.deliveries (event_pk, endpoint, status, last_error)
		SELECT id, 'p', 'dead_letter', 'messages_off: written with outbox.Emit' FROM e`)
	require.NoError(t, err)

	code, out, errOut = postbox(t, "replay", "--config", off, "--dead-letters")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "enqueued 0 events")
	require.Contains(t, errOut, "left out 1 event written with outbox.Emit: outbox_messages is off")
	require.Zero(t, queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'pending'`))

	on := writeConfig(t, dbURL, "outbox_messages: true\n")
	code, out, errOut = postbox(t, "replay", "--config", on, "--dead-letters")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "enqueued 1 event")
	require.NotContains(t, errOut, "left out")
	require.Equal(t, 1, queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'pending'`))
}
