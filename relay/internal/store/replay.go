package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// replayCandidatesSQL selects the events of a replay with their latest
// delivery, leaving out those whose payload was too large to store. $1 dead letters only, $2 endpoint, $3 since, $4 until, $5 from
// LSN, $6 event ids, $7 limit.
const replayCandidatesSQL = `
SELECT e.id, e.event_id::text, e.endpoint, e.event_type, coalesce(e.commit_lsn::text, ''),
       coalesce(e.committed_at, e.ingested_at), last.id, coalesce(last.status, 'in_flight'), -- none: under way
       e.message, e.endpoint = '' AND e.matched IS NOT NULL
FROM postbox.events e
LEFT JOIN LATERAL (
  SELECT d.id, d.status FROM postbox.deliveries d WHERE d.event_pk = e.id ORDER BY d.id DESC LIMIT 1
) last ON true
WHERE ($2 = '' OR e.endpoint = $2)
  AND ($3::timestamptz IS NULL OR coalesce(e.committed_at, e.ingested_at) >= $3)
  AND ($4::timestamptz IS NULL OR coalesce(e.committed_at, e.ingested_at) < $4)
  AND ($5::pg_lsn IS NULL OR e.commit_lsn >= $5)
  AND (cardinality($6::uuid[]) = 0 OR e.event_id = ANY($6))
  AND (NOT $1 OR last.status = 'dead_letter')
  AND e.payload_dropped IS NULL -- its payload was never stored: nothing to send
ORDER BY coalesce(e.commit_lsn, '0/0'), e.id
LIMIT CASE WHEN $7 > 0 THEN $7 END`

// rerouteSQL replays events of rows routed to no endpoint (no_subscriber,
// $1 their ids): it routes each again, in SQL, under postbox.endpoints
// as it is now (event_types exact, "p.*" and "*", the exact type first,
// then the longest prefix, as config.EndpointTable.Subscribers does; the
// filter by jsonb's own @>), adds an event and a pending delivery per
// endpoint matched, and supersedes the no_subscriber dead letter of those
// that matched one. It returns how many deliveries it added. Rows the
// stream found invalid (their dead letter is not no_subscriber) are left.
const rerouteSQL = `
WITH src AS (
  SELECT e.* FROM postbox.events e
  WHERE e.id = ANY($1) AND e.event_type <> ''
    AND EXISTS (SELECT FROM postbox.deliveries d WHERE d.event_pk = e.id AND d.status = 'dead_letter' AND d.last_error LIKE 'no_subscriber%')
), m AS (
  SELECT s.id AS src, ep.name, ep.filter IS NOT NULL AS filtered,
         (SELECT p FROM unnest(ep.event_types) p
          WHERE p = s.event_type OR p = '*' OR (p LIKE '%.*' AND starts_with(s.event_type, left(p, -1)))
          ORDER BY p = s.event_type DESC, length(p) DESC LIMIT 1) AS pattern
  FROM src s JOIN postbox.endpoints ep ON ep.enabled AND (ep.filter IS NULL OR s.payload @> ep.filter)
), ev AS (
  INSERT INTO postbox.events (event_id, endpoint, url, event_type, payload, headers, created_at, outbox_id,
                              commit_lsn, committed_at, search, message, matched)
  SELECT s.event_id, m.name, s.url, s.event_type, s.payload, s.headers, s.created_at, s.outbox_id,
         s.commit_lsn, s.committed_at, s.search, s.message, m.pattern || CASE WHEN m.filtered THEN ' + filter' ELSE '' END
  FROM m JOIN src s ON s.id = m.src
  WHERE m.pattern IS NOT NULL
  ORDER BY s.event_id, m.name
  ON CONFLICT (event_id, endpoint) DO NOTHING
  RETURNING id, event_id, endpoint
), added AS (
  INSERT INTO postbox.deliveries (event_pk, endpoint, status)
  SELECT id, endpoint, 'pending' FROM ev ORDER BY id
  RETURNING event_pk
), superseded AS (
  UPDATE postbox.deliveries d SET status = 'replayed'
  FROM src s
  WHERE d.event_pk = s.id AND d.status = 'dead_letter'
    AND s.event_id IN (SELECT event_id FROM ev)
)
SELECT count(*) FROM added`

// Replay selects events by f and, unless dryRun, enqueues a new delivery
// for each that has none waiting, keeping its event id, so receivers can
// drop what they already have. With rate > 0 the deliveries fall due
// spread out at that many a second, to trickle a large replay. Replays
// read postbox's event log, so they work after the slot has moved on, for
// as long as event_retention keeps the events.
func (s *Store) Replay(ctx context.Context, f postboxtype.ReplayFilter, dryRun bool, rate float64) ([]postboxtype.ReplayItem, int, error) {
	return s.ReplayTo(ctx, f, dryRun, rate, nil)
}

// ReplayTo is Replay, retargeting the deliveries it enqueues when f has a
// URL or EndpointURL: each keeps where it goes in its url column (its
// event keeps the row's), and its lane is lane(endpoint), the lane a
// delivery of that endpoint to that target is queued under
// (config.Config.Lane); lane may be nil when f retargets nothing.
// Events routed again (no_subscriber) are routed as Replay does, never
// retargeted.
func (s *Store) ReplayTo(ctx context.Context, f postboxtype.ReplayFilter, dryRun bool, rate float64, lane func(endpoint string) string) ([]postboxtype.ReplayItem, int, error) {
	var url *string // NULL: the event's own
	switch {
	case f.URL != "":
		url = &f.URL
	case f.EndpointURL:
		none := ""
		url = &none
	}
	var since, until *time.Time
	if !f.Since.IsZero() {
		since = &f.Since
	}
	if !f.Until.IsZero() {
		until = &f.Until
	}
	var lsn *string
	if f.FromLSN != 0 {
		l := pglogrepl.LSN(f.FromLSN).String()
		lsn = &l
	}
	ids := f.EventIDs
	if ids == nil {
		ids = []string{}
	}
	var items []postboxtype.ReplayItem
	enqueued := 0
	err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, replayCandidatesSQL, f.DeadLetters, f.Endpoint, since, until, lsn, ids, f.Limit)
		if err != nil {
			return err
		}
		var pks, lastIDs, unrouted []int64
		var endpoints []string
		for rows.Next() {
			var it postboxtype.ReplayItem
			var pk int64
			var last *int64
			var message, routedNone bool
			if err := rows.Scan(&pk, &it.EventID, &it.Endpoint, &it.EventType, &it.CommitLSN, &it.Committed, &last, &it.LastStatus, &message, &routedNone); err != nil {
				rows.Close()
				return err
			}
			switch {
			case it.LastStatus.Queued():
				it.Queued = true
			case routedNone:
				// Routed to no endpoint: replayed by routing it again.
				unrouted = append(unrouted, pk)
			case message && f.NoMessages:
				// Its attempt would dead-letter it again (messages_off).
				it.MessagesOff = true
			default:
				pks, endpoints = append(pks, pk), append(endpoints, it.Endpoint)
				if last != nil {
					lastIDs = append(lastIDs, *last)
				} else {
					lastIDs = append(lastIDs, 0)
				}
			}
			items = append(items, it)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if dryRun {
			return nil
		}
		if len(unrouted) > 0 {
			var n int
			if err := tx.QueryRow(ctx, rerouteSQL, unrouted).Scan(&n); err != nil {
				return fmt.Errorf("route again: %w", err)
			}
			enqueued += n
		}
		if len(pks) == 0 {
			if enqueued > 0 {
				_, err := tx.Exec(ctx, `SELECT pg_notify($1, '')`, WakeChannel)
				return err
			}
			return nil
		}
		var lanes []*string // nil: the last delivery's
		if url != nil {
			lanes = make([]*string, len(endpoints))
			for i, ep := range endpoints {
				if l := lane(ep); l != ep {
					lanes[i] = &l
				}
			}
		}
		var n int
		step := 0.0
		if rate > 0 {
			step = 1 / rate
		}
		// The dead letters replayed are superseded: no longer counted as
		// dead letters, their history kept.
		err = tx.QueryRow(ctx, `
			WITH added AS (
			  INSERT INTO postbox.deliveries (event_pk, endpoint, lane, status, next_attempt_at, replay_of, url)
			  SELECT pk, endpoint,
			         CASE WHEN $5::text IS NULL THEN (SELECT l.lane FROM postbox.deliveries l WHERE l.id = r.last) -- the last delivery's lane
			              ELSE ($6::text[])[ord] END, -- the retarget's
			         'pending', now() + (ord - 1) * $4::float8 * interval '1 second', nullif(last, 0), $5
			  FROM unnest($1::int8[], $2::text[], $3::int8[]) WITH ORDINALITY AS r(pk, endpoint, last, ord)
			  ON CONFLICT (event_pk, (CASE WHEN status IN ('pending', 'in_flight', 'failed') THEN 0 ELSE id END)) DO NOTHING
			  RETURNING replay_of
			), superseded AS (
			  UPDATE postbox.deliveries d SET status = 'replayed'
			  FROM added WHERE d.id = added.replay_of AND d.status = 'dead_letter'
			)
			SELECT count(*) FROM added`,
			pks, endpoints, lastIDs, step, url, lanes).Scan(&n)
		if err != nil {
			return err
		}
		enqueued += n
		_, err = tx.Exec(ctx, `SELECT pg_notify($1, '')`, WakeChannel)
		return err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("replay: %w", err)
	}
	return items, enqueued, nil
}
