// Package console is postbox's web console, served by the admin listener
// at every path it does not serve itself: server-rendered pages
// (html/template; templates, one stylesheet and an icon embedded in the
// binary; no scripts, no fonts or anything else from elsewhere).
//
//	/                      health summary, firing alerts, queue, slot lag,
//	                       instances, commit→delivery p50/p99 of the hour,
//	                       deliveries and failed attempts per minute
//	/endpoints             where each is defined (file, table), state,
//	                       p50/p95/p99, samples, failures, queue
//	/endpoints/NAME        latency per five minutes over 24 h, recent
//	                       attempts, pause and resume; a table endpoint's
//	                       edit form, disable, enable, delete; its changes
//	/new-endpoint          a new row of postbox.endpoints
//	/dead-letters          the analysis with its advice, the list, replay
//	/events?payload=K%3DV  search (also endpoint, status, since, until)
//	/events/ID             the timeline: each delivery, attempt and replay
//
// Charts are SVG drawn by the server (Chart). Every page reads summarised
// or indexed queries and bounded lists, so it stays fast with millions of
// deliveries a day.
//
// # Who may read and act
//
// Reading: when the listener is bound to loopback, a request addressed to
// a loopback host (localhost, 127.0.0.1, [::1]) reads without a token,
// unless admin_token_on_loopback is set (for hosts and pods where others
// share loopback).
// Any other request (the listener bound elsewhere, or a Host header that
// names something else: a proxy, or a DNS-rebinding page) must prove
// admin_token: by "Authorization: Bearer <token>", or by the session
// cookie that the sign-in form sets. The cookie (HttpOnly,
// SameSite=Strict, Secure over TLS, 12 hours) holds an id and an
// HMAC-SHA256 of it keyed by the token: never the token, and changing the
// token ends every session.
//
// Acting (replay, pause, resume, an endpoint's create, edit, disable,
// enable and delete, sign-out): a POST only, and only when
// admin_token is configured (without one the pages say how to enable
// actions). The request must prove the token as above, come from the
// console's own pages (Sec-Fetch-Site, else Origin, else Referer naming
// this host; a request with none of them passes only with the bearer
// header, which a browser cannot add across sites), and carry the
// session's form token (an HMAC of the session id). Sign-in is a POST with
// the same origin check; a wrong token holds every sign-in back for a
// moment.
//
// # Endpoints as rows
//
// The endpoint form writes postbox.endpoints (the file's endpoints are
// read-only here). A value is judged as the relay will judge the row:
// PostgreSQL casts it to its column's type and gives its text output,
// endpoints.Parse reads the row, and the configuration in force resolves
// it as the only endpoint of a scratch table; a reason (it names its
// column) or a constraint's refusal is shown next to its field, and
// nothing is written. The write is one transaction that first sets
// postbox.actor to console:s-<8 hex> (a hash of the session's id;
// console:bearer for the bearer header), which the change log records.
// An edit applies only over the revision its form was read at. Header
// values may be credentials: no page shows them (a stored header reads
// "Name: ***", and a line left so keeps its value).
//
// Pages show no secrets, and no URL query strings or response bodies
// unless log_payloads is on: targets are stored as scheme://host/path,
// and stored text (errors, responses) passes the log field policy again
// on the way out. Every page sets a Content-Security-Policy without
// scripts, forbids framing, and is not cached.
package console
