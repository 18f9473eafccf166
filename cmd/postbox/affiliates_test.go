package main

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestAffiliatesTriggerPattern runs docs/integration.md's "Partners kept
// in the application's table" as it tells a platform to: the trigger on
// affiliates keeps postbox.endpoints in step with the back office's
// writes, made as the application's role with the docs' grants alone; the
// change log names that role, which can neither read nor write the log,
// nor anything else of postbox's but the outbox and the endpoints.
func TestAffiliatesTriggerPattern(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	doc, err := os.ReadFile("../../docs/integration.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(doc), "\n## Partners kept in the application's table\n")
	require.True(t, ok)
	section, _, _ = strings.Cut(section, "\n## ")
	blocks := sqlBlocks(section)
	require.Len(t, blocks, 4, "the table, the trigger, the back office's transaction, the grants")

	r := newRoles(t)
	cfg := writeConfig(t, r.dbURL, "")
	code, out, errOut := postbox(t, "migrate", "--config", cfg)
	require.Equal(t, exitOK, code, out+errOut)
	_, err = r.super.Exec(ctx, `CREATE ROLE `+r.app+` LOGIN`)
	require.NoError(t, err)
	// The application's migrations: its table and trigger (here the
	// superuser's; the application's role writes the table, as it owns it
	// in production), then the docs' grants.
	for _, b := range blocks[:2] {
		_, err = r.super.Exec(ctx, b)
		require.NoError(t, err, b)
	}
	_, err = r.super.Exec(ctx, `GRANT SELECT, INSERT, UPDATE, DELETE ON affiliates TO `+r.app)
	require.NoError(t, err)
	_, err = r.super.Exec(ctx, regexp.MustCompile(`\bTO app\b`).ReplaceAllString(blocks[3], "TO "+r.app))
	require.NoError(t, err)

	// The back office's transaction, as the application's role.
	r.exec(t, r.app, blocks[2])
	var id int64
	require.NoError(t, r.super.QueryRow(ctx, `SELECT id FROM affiliates WHERE name = 'Acme'`).Scan(&id))
	name := "affiliate_" + strconv.FormatInt(id, 10)
	var url string
	var enabled bool
	require.NoError(t, r.super.QueryRow(ctx, `SELECT url, enabled FROM postbox.endpoints WHERE name = $1`, name).Scan(&url, &enabled))
	require.Equal(t, "https://t.acme.example/v2/pb?cid={payload.click_id}&amount={payload.payout}", url)
	require.True(t, enabled)
	require.Equal(t, 1, queryInt(t, r.super, `SELECT count(*) FROM postbox.outbox WHERE endpoint = $1 AND event_type = 'ftd'`, name))
	rows, err := r.super.Query(ctx, `SELECT op || ' ' || actor FROM postbox.endpoint_changes WHERE name = $1 ORDER BY id`, name)
	require.NoError(t, err)
	actors, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"insert " + r.app, "update " + r.app}, actors)

	// An inactive affiliate's endpoint is disabled; a write that changes
	// nothing of it is no change; without a URL, or deleted, it has none.
	r.exec(t, r.app, `UPDATE affiliates SET active = false WHERE name = 'Acme'`)
	require.NoError(t, r.super.QueryRow(ctx, `SELECT enabled FROM postbox.endpoints WHERE name = $1`, name).Scan(&enabled))
	require.False(t, enabled)
	r.exec(t, r.app, `UPDATE affiliates SET active = false, name = 'Acme' WHERE name = 'Acme'`)
	require.Equal(t, 3, queryInt(t, r.super, `SELECT count(*) FROM postbox.endpoint_changes WHERE name = $1`, name))
	r.exec(t, r.app, `UPDATE affiliates SET postback_url = NULL WHERE name = 'Acme'`)
	require.Zero(t, queryInt(t, r.super, `SELECT count(*) FROM postbox.endpoints WHERE name = $1`, name))
	r.exec(t, r.app, `UPDATE affiliates SET postback_url = 'https://x.example/pb' WHERE name = 'Acme'`)
	r.exec(t, r.app, `DELETE FROM affiliates WHERE name = 'Acme'`)
	require.Zero(t, queryInt(t, r.super, `SELECT count(*) FROM postbox.endpoints WHERE name = $1`, name))

	code, out, errOut = postbox(t, "endpoints", "history", name, "--config", cfg)
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, 6, strings.Count(out, "  by "+r.app+"\n"), out)

	// Nothing else of postbox's: not the log, not the revisions, not the queue.
	conn, err := pgx.Connect(ctx, r.as(r.app))
	require.NoError(t, err)
	defer conn.Close(ctx)
	for _, sql := range []string{
		`SELECT count(*) FROM postbox.endpoint_changes`,
		`INSERT INTO postbox.endpoint_changes (name, op, revision, actor) VALUES ('x', 'insert', 1, 'forged')`,
		`SELECT nextval('postbox.endpoint_revision')`,
		`SELECT count(*) FROM postbox.deliveries`,
		`SELECT count(*) FROM postbox.endpoint_state`,
	} {
		_, err := conn.Exec(ctx, sql)
		require.ErrorContains(t, err, "permission denied", sql)
	}
}
