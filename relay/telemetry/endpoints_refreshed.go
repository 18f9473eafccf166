package telemetry

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// endpointQueuesSQL counts the unfinished and dead-lettered deliveries per
// endpoint, each state through its own partial index: a scan of all
// deliveries for "status IN (…)" reads every delivered row too. Events
// under way (no delivery written yet) count in flight. A delivery in flight
// always has its owner (lease_owner), which deliveries_lease_owner's
// predicate asks for; a retry an instance keeps counts as failed.
const endpointQueuesSQL = `
SELECT endpoint, 'pending', count(*) FROM postbox.deliveries WHERE status = 'pending' AND ($1 = '' OR endpoint = $1) GROUP BY endpoint
UNION ALL
SELECT endpoint, 'failed', count(*) FROM postbox.deliveries WHERE status = 'failed' AND ($1 = '' OR endpoint = $1) GROUP BY endpoint
UNION ALL
SELECT endpoint, 'in_flight', count(*) FROM postbox.deliveries WHERE status = 'in_flight' AND lease_owner IS NOT NULL AND ($1 = '' OR endpoint = $1) GROUP BY endpoint
UNION ALL
SELECT endpoint, 'in_flight', count(*) FROM postbox.events_under_way WHERE $1 = '' OR endpoint = $1 GROUP BY endpoint
UNION ALL
SELECT endpoint, 'dead_letter', count(*) FROM postbox.deliveries WHERE status = 'dead_letter' AND ($1 = '' OR endpoint = $1) GROUP BY endpoint`

// LoadEndpointsRefreshed is LoadEndpoints with the percentiles and sample
// counts as of the last refresh (RefreshPercentiles: at most a minute old
// while a relay runs) instead of computed from the samples now. It reads
// no samples, so it answers in milliseconds however busy the endpoints
// are; the console's pages use it. Endpoints come in name order: those
// with health (any attempt recorded) or deliveries in the queue.
func LoadEndpointsRefreshed(ctx context.Context, q Querier, endpoint string) ([]EndpointStats, error) {
	stored, err := LoadStoredEndpoints(ctx, q)
	if err != nil {
		return nil, err
	}
	var out []EndpointStats
	at := map[string]int{} // index in out
	for _, e := range stored {
		if endpoint == "" || e.Endpoint == endpoint {
			at[e.Endpoint] = len(out)
			out = append(out, e)
		}
	}
	rows, err := q.Query(ctx, endpointQueuesSQL, endpoint)
	if err != nil {
		return nil, fmt.Errorf("endpoint queues: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name, status string
		var n int64
		if err := rows.Scan(&name, &status, &n); err != nil {
			return nil, fmt.Errorf("endpoint queues: %w", err)
		}
		i, ok := at[name]
		if !ok {
			i = len(out)
			at[name] = i
			out = append(out, EndpointStats{Endpoint: name, State: postboxtype.BreakerClosed})
		}
		switch status {
		case "pending":
			out[i].Pending = n
		case "failed":
			out[i].AwaitingRetry = n
		case "in_flight": // deliveries, then events under way
			out[i].InFlight += n
		case "dead_letter":
			out[i].DeadLetter = n
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("endpoint queues: %w", err)
	}
	slices.SortFunc(out, func(a, b EndpointStats) int { return strings.Compare(a.Endpoint, b.Endpoint) })
	return out, nil
}
