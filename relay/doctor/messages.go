package doctor

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// messagesCheck judges outbox_messages. Off, events written with
// outbox.Emit become dead letters (messages_off), which it counts. On, any
// role that may run pg_logical_emit_message can make postbox send a signed
// event, so every grantee of it beside outbox_message_roles (and
// superusers) is an error, with the statements that fix it.
func messagesCheck(ctx context.Context, q telemetry.Querier, cfg *config.Config) Check {
	c := Check{Name: "outbox_messages", Severity: OK}
	if !cfg.Messages {
		c.Detail = "off: only outbox table rows are delivered; an event written with outbox.Emit becomes a messages_off dead letter"
		var n int64
		err := q.QueryRow(ctx, `SELECT count(*) FROM postbox.deliveries WHERE status = 'dead_letter' AND last_error LIKE 'messages_off%'`).Scan(&n)
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == "42P01": // not migrated yet
		case err != nil:
			c.Severity, c.Detail = Warn, c.Detail+"; could not count them: "+err.Error()
		case n > 0:
			c.Severity = Warn
			c.Detail = fmt.Sprintf("off, and %d events written with outbox.Emit are dead letters (messages_off), never attempted", n)
			c.Fix = "if the application emits them, set outbox_messages: true and outbox_message_roles, then postbox replay --dead-letters; " +
				"if it does not, a database role forged them: revoke EXECUTE on pg_logical_emit_message from PUBLIC"
		}
		return c
	}
	g, err := store.LoadEmitGrants(ctx, q, cfg.MessageRoles)
	if err != nil {
		c.Severity, c.Detail = Warn, err.Error()
		return c
	}
	if w := g.Warning(); w != "" {
		c.Severity, c.Detail = Error, w
		c.Fix = "as a superuser: " + strings.Join(g.Fix, "; ")
		return c
	}
	who := "superusers only"
	if len(cfg.MessageRoles) > 0 {
		who = strings.Join(cfg.MessageRoles, ", ") + " (and their members) and superusers"
	}
	c.Detail = "on: events written with outbox.Emit are delivered; pg_logical_emit_message is executable by " + who
	return c
}
