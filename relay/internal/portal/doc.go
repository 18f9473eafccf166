// Package portal is the partner portal: pages under /portal/ where a
// partner sees its own endpoint's traffic and nothing else, opened by a
// link the operator hands out (postbox portal link, or the console).
//
//	/portal/link/TOKEN       exchanges the link's token for a session
//	                         cookie and redirects to /portal/
//	/portal/                 deliveries: period, status, type, time,
//	                         search by a search_keys field
//	/portal/events/ID        the event's timeline and payload
//	/portal/health           success rate, p50/p95/p99, breaker, pause
//	/portal/verify           how to verify signatures (the secret with
//	                         portal.show_secret)
//	/portal/report           daily counts per event type (relay/report),
//	/portal/report/day.csv   and a day's deliveries as CSV
//	POST /portal/replay      resend a dead letter (portal.allow_replay)
//
// # Links and sessions
//
// A link's token is base64url JSON (endpoint, expiry, the endpoint's
// portal version, a link id) and an HMAC-SHA256 of it keyed by
// portal.key (or a key derived from the newest signing secret). The
// session cookie is the same claims plus its own issue time and random
// id, signed under another label, so neither stands for the other.
// Every request checks the signature, the link's expiry, the session's
// age (SessionTTL) and the endpoint's current version in
// postbox.portal_versions: postbox portal revoke bumps it and every link
// and session of that partner ends at its next request. Keyed by name,
// the version serves endpoints of the file and rows alike.
//
// # Isolation
//
// The endpoint comes from the session only: no page takes one from the
// URL, and every query is bound to it (an event id of another partner
// reads as one that does not exist). The cookie is HttpOnly,
// SameSite=Lax (a link in an email is a cross-site navigation), Path
// /portal/, and named apart from the console's, which never reads it.
// Pages carry the console's CSP (no scripts), forbid framing and are not
// cached; actions are POSTs from the portal's own pages (Sec-Fetch-Site,
// Origin or Referer) with the session's form token. Link openings are
// rate-limited per client address (a bad token also holds every other
// opening back), exports per link, resends per endpoint. The token is
// never logged: openings log the endpoint and the link's id.
package portal
