package main

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/pgtest"
)

// TestEventShowsWhyEachEndpointMatched: `postbox event ID` of a row routed
// by subscription shows, for each endpoint, the pattern (and filter) that
// matched; of one that matched none, that it went to no endpoint and the
// dead letter's reason.
func TestEventShowsWhyEachEndpointMatched(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	cfg := writeConfig(t, dbURL, "")
	code, _, errOut := postbox(t, "migrate", "--config", cfg)
	require.Equal(t, exitOK, code, errOut)
	ctx := context.Background()
	event := func(id, endpoint, matched, status, lastError string) {
		t.Helper()
		_, err := pool.Exec(ctx, `
			WITH e AS (INSERT INTO postbox.events (event_id, endpoint, event_type, payload, created_at, matched)
			           VALUES ($1, $2, 'order.paid', '{}', now(), $3) RETURNING id)
			INSERT INTO postbox.deliveries (event_pk, endpoint, status, last_error, delivered_at)
			SELECT e.id, $2, $4, nullif($5, ''), CASE WHEN $4 = 'delivered' THEN now() END FROM e`, id, endpoint, matched, status, lastError)
		require.NoError(t, err)
	}
	const routed, nobody = "7f1c6a52-8a35-4f0e-9f4e-1d2a3b4c5d6e", "0a9b8c7d-6e5f-4a3b-8c2d-1e0f9a8b7c6d"
	event(routed, "casino", "order.* + filter", "delivered", "")
	event(routed, "orders", "order.*", "delivered", "")
	event(nobody, "", "", "dead_letter", "no_subscriber: no enabled endpoint subscribes to its event type (or its filter did not hold)")

	code, out, errOut := postbox(t, "event", "--config", cfg, routed)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "event "+routed+" (order.paid) to casino\n  matched    order.* + filter (routed by subscription)\n")
	require.Contains(t, out, "event "+routed+" (order.paid) to orders\n  matched    order.* (routed by subscription)\n")

	code, out, errOut = postbox(t, "event", "--config", cfg, routed, "--json")
	require.Equal(t, exitOK, code, errOut)
	var stories []struct {
		Endpoint string  `json:"endpoint"`
		Matched  *string `json:"matched"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &stories), out)
	require.Len(t, stories, 2)
	require.Equal(t, "casino", stories[0].Endpoint)
	require.Equal(t, "order.* + filter", *stories[0].Matched)

	code, out, errOut = postbox(t, "event", "--config", cfg, nobody)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "event "+nobody+" (order.paid) to no endpoint\n  matched    no endpoint: routed by its type, to none (the dead letter says why)\n")
	require.Contains(t, out, "no attempt: no_subscriber: no enabled endpoint subscribes")
}
