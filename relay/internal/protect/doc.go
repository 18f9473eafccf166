// Package protect holds an endpoint back when it must not be sent to: its
// circuit breaker (shared by every instance through
// postbox.endpoint_health, with exactly one probe when half-open), pauses
// its receiver asked for (429, Retry-After), a local streak of failures
// that holds it until the shared breaker speaks, and its token bucket
// (shared through postbox.rate_buckets).
//
// The database is the truth; Protection is this instance's view of it,
// refreshed on every claim cycle and from every recorded batch. Held-back
// events wait in the queue without spending attempts.
package protect
