package ingest

import (
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/store"
)

// route is the stream's Route (wal.Options.Route): it finds the endpoints
// a row without one goes to as the row is decoded, so under the endpoint
// changes the stream applied before it, whenever the row is prepared.
func (s *Supervisor) route(row *store.OutboxRow) {
	routeRow(s.env.Config(), row)
}

func routeRow(cfg *config.Config, row *store.OutboxRow) {
	ms := cfg.EndpointTable.Subscribers(row.EventType, row.Payload)
	row.Routed = true
	row.Matches = make([]store.Match, len(ms))
	for i, m := range ms {
		row.Matches[i] = store.Match{Endpoint: m.Endpoint, Why: m.Why()}
	}
}

// fanOut is rows as the events they are ingested as: a row with its
// endpoint, itself; a row routed by subscription, one event per endpoint
// matched, each with why, or when none matched itself under endpoint ""
// (a no_subscriber dead letter, see newEvent). A row the stream did not
// route (the reconciliation's) is routed now, under cfg. The rows are
// returned as they are when none was routed.
func fanOut(cfg *config.Config, rows []store.OutboxRow) []store.OutboxRow {
	n, fan := 0, false
	for i := range rows {
		r := &rows[i]
		if !r.Fanout || r.Invalid != "" {
			n++
			continue
		}
		fan = true
		if !r.Routed {
			routeRow(cfg, r)
		}
		n += max(len(r.Matches), 1)
	}
	if !fan {
		return rows
	}
	out := make([]store.OutboxRow, 0, n)
	for _, r := range rows {
		if !r.Fanout || r.Invalid != "" || len(r.Matches) == 0 {
			r.Matches = nil
			out = append(out, r)
			continue
		}
		ms := r.Matches
		r.Matches = nil
		for _, m := range ms {
			r.Endpoint, r.Matched = m.Endpoint, m.Why
			out = append(out, r)
		}
	}
	return out
}
