package endpoints_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/endpoints"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

// textRow reads postbox.endpoints row name as PostgreSQL's text output
// of each column, as the stream sends it.
func textRow(t *testing.T, conn *pgx.Conn, name string) endpoints.Row {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT * FROM postbox.endpoints WHERE name = $1`,
		pgx.QueryResultFormats{pgx.TextFormatCode}, name)
	require.NoError(t, err)
	got, err := endpoints.CollectRows(rows)
	require.NoError(t, err)
	require.Len(t, got, 1)
	return got[0]
}

// TestParseReadsEveryColumnAsTheFileWouldWriteIt: a row setting every
// column resolves to the settings the same keys give in the file; a row
// with a value only postbox can judge is invalid, naming its column.
func TestParseReadsEveryColumnAsTheFileWouldWriteIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	pool, err := store.Open(ctx, url, 2)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	table, _ := outbox.ParseTable(outbox.DefaultTable)
	require.NoError(t, store.Migrate(ctx, pool, table))
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })

	_, err = conn.Exec(ctx, `INSERT INTO postbox.endpoints (name, url, method, body, headers, timeout, max_attempts, backoff_base, backoff_cap,
		  failure_threshold, cooldown, max_cooldown, rate_limit, max_in_flight, success, retry_on, ordered, redact_path,
		  allow_row_url, row_url_hosts, enabled, event_types, filter, secret_version, previous_secret_until)
		VALUES ('aff-7', 'https://t.example/pb?click={payload.click_id}', 'get', '{"a": "{payload.payout}"}', '{"X-Key": "k"}', '1 day 00:00:02.5', 7,
		  '10 seconds', '2 hours', 3, '1 minute', '1 hour', '50/s', 4, '{"status": [200, 204], "body_contains": "OK"}', '{409,503}',
		  true, '[4]', true, '{pb.example.com,"*.example.org"}', false, '{conversion.*,signup}', '{"brand": "casino-de"}', 2,
		  '2026-12-08 10:00:00+00')`)
	require.NoError(t, err)
	te := endpoints.Parse(textRow(t, conn, "aff-7"))
	require.Empty(t, te.Invalid)
	require.Equal(t, "aff-7", te.Name)
	require.False(t, te.Enabled)
	require.Equal(t, []string{"conversion.*", "signup"}, te.EventTypes)
	require.JSONEq(t, `{"brand": "casino-de"}`, string(te.Filter))
	require.Equal(t, 2, te.SecretVersion)
	require.True(t, te.PreviousSecretUntil.Equal(time.Date(2026, 12, 8, 10, 0, 0, 0, time.UTC)))
	require.NotZero(t, te.Revision, "stamped by the trigger")

	f := config.Default()
	f.Signing.Secrets = []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}
	cfg, err := f.Resolve()
	require.NoError(t, err)
	cfg.EndpointTable = config.NewEndpointTable()
	cfg.EndpointTable.Apply(te)
	ep := cfg.Endpoint("aff-7")
	require.Equal(t, config.SourceTable, ep.Source)
	require.True(t, ep.Configured)
	require.Equal(t, "disabled", ep.Held())
	require.Equal(t, "GET", ep.Method)
	require.Equal(t, 24*time.Hour+2500*time.Millisecond, ep.Timeout)
	require.Equal(t, 7, ep.MaxAttempts)
	require.Equal(t, 10*time.Second, ep.BackoffBase)
	require.Equal(t, 2*time.Hour, ep.BackoffCap)
	require.Equal(t, 3, ep.FailureThreshold)
	require.Equal(t, time.Minute, ep.Cooldown)
	require.Equal(t, config.Rate{N: 50, Per: time.Second}, ep.RateLimit)
	require.Equal(t, 4, ep.MaxInFlight)
	require.Equal(t, config.Success{Status: []int{200, 204}, BodyContains: "OK"}, ep.Success)
	require.Equal(t, []int{409, 503}, ep.RetryOn)
	require.True(t, ep.Ordered)
	require.True(t, ep.RedactPath.Segment(4))
	require.False(t, ep.RedactPath.Segment(3))
	require.True(t, ep.AllowRowURL)
	require.Equal(t, []string{"pb.example.com", "*.example.org"}, ep.RowURLHosts)
	require.Equal(t, map[string]string{"X-Key": "k"}, ep.Headers)
	require.Equal(t, `{"a": "{payload.payout}"}`, *ep.Body)

	for _, c := range []struct{ name, set, invalid string }{
		{"template", `url = 'https://t.example/{nope'`, "url"},
		{"reserved header", `headers = '{"Webhook-Signature": "x"}'`, "headers: Webhook-Signature is set by postbox"},
		{"rate", `rate_limit = 'fast'`, "rate_limit"},
		{"months", `timeout = '1 month'`, "timeout"},
		{"header value", `headers = '{"X": 1}'`, "headers"},
		{"success key", `success = '{"stauts": [200]}'`, "success"},
		{"named secret", `secret = 'nobody'`, "secret"},
	} {
		_, err := conn.Exec(ctx, `INSERT INTO postbox.endpoints (name, url) VALUES ($1, 'https://t.example/')`, c.name)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `UPDATE postbox.endpoints SET `+c.set+` WHERE name = $1`, c.name)
		require.NoError(t, err, c.name)
		cfg.EndpointTable.Apply(endpoints.Parse(textRow(t, conn, c.name)))
		held := cfg.Endpoint(c.name).Held()
		require.Contains(t, held, "invalid: "+c.invalid, c.name)
	}

	// What SQL can refuse, it refuses.
	for _, bad := range []string{`timeout = '-1 second'`, `method = 'DELETE'`, `max_in_flight = 0`, `headers = '[1]'`} {
		_, err := conn.Exec(ctx, `UPDATE postbox.endpoints SET `+bad+` WHERE name = 'template'`)
		require.Error(t, err, bad)
	}
}
