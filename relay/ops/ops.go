// Package ops holds what operators do to a running deployment from outside
// the relay: replaying events, pausing and resuming endpoints, writing
// the endpoints of postbox.endpoints and reading their change log. Every action
// works on the database alone, so it answers while no relay runs, and
// every relay sees its effect.
package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/endpoints"
	"github.com/postbox-relay/postbox/relay/internal/store"
	"github.com/postbox-relay/postbox/relay/macro"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// Replay enqueues a new delivery for each event f selects (keeping its
// event id, so receivers still deduplicate), spread out at rate events a
// second when rate is positive. With dryRun it only lists them. It returns
// the selection and how many deliveries it enqueued. While cfg has
// outbox_messages off, events written with outbox.Emit are left out
// (postboxtype.ReplayItem.MessagesOff): a relay would dead-letter them again.
//
// f.URL and f.EndpointURL retarget the deliveries (see
// postboxtype.ReplayFilter): f.URL is checked here as an endpoint's url
// is (absolute, http or https, its macros parsing), and at each attempt as
// a row's url is. Retargeting every endpoint's events to one URL is
// refused: f.URL needs f.Endpoint or f.EventIDs.
func Replay(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config, f postboxtype.ReplayFilter, dryRun bool, rate float64) ([]postboxtype.ReplayItem, int, error) {
	if err := CheckRetarget(f); err != nil {
		return nil, 0, err
	}
	s := &store.Store{Pool: pool, Table: cfg.Table, Slot: cfg.Slot}
	f.NoMessages = f.NoMessages || !cfg.Messages
	if f.URL != "" && cfg.EndpointTable == nil {
		var err error
		if cfg, err = withApplied(ctx, pool, cfg, f); err != nil {
			return nil, 0, err
		}
	}
	return s.ReplayTo(ctx, f, dryRun, rate, func(endpoint string) string { return cfg.Lane(endpoint, f.URL) })
}

// withApplied is cfg, which has no table of its own (a command's), with
// the rows the streaming instance applied (postbox.endpoint_state) of the
// endpoints a retargeted replay of f reaches: the lane of a delivery to a
// url of its own depends on its endpoint's settings (config.Config.Lane).
func withApplied(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config, f postboxtype.ReplayFilter) (*config.Config, error) {
	ids := f.EventIDs
	if ids == nil {
		ids = []string{}
	}
	rows, err := pool.Query(ctx, `
		SELECT row::text FROM postbox.endpoint_state
		WHERE jsonb_typeof(row) = 'object'
		  AND (name = $1 OR name IN (SELECT endpoint FROM postbox.events WHERE event_id = ANY($2::uuid[])))`, f.Endpoint, ids)
	if err != nil {
		return nil, fmt.Errorf("replay: read the applied endpoints: %w", err)
	}
	defer rows.Close()
	var tes []config.TableEndpoint
	for rows.Next() {
		var text string
		if err := rows.Scan(&text); err != nil {
			return nil, fmt.Errorf("replay: read the applied endpoints: %w", err)
		}
		var row endpoints.Row
		if err := json.Unmarshal([]byte(text), &row); err != nil {
			return nil, fmt.Errorf("replay: read the applied endpoints: %w", err)
		}
		tes = append(tes, endpoints.Parse(row))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("replay: read the applied endpoints: %w", err)
	}
	c := *cfg
	c.EndpointTable = config.NewEndpointTable()
	c.EndpointTable.Replace(tes)
	return &c, nil
}

// ErrRetarget is the error of a replay's retarget that cannot be used:
// a URL that is not one, or one given with the endpoint url, or for every
// endpoint's events.
var ErrRetarget = errors.New("replay")

// CheckRetarget checks the retarget of f (its URL and EndpointURL) before
// anything is enqueued.
func CheckRetarget(f postboxtype.ReplayFilter) error {
	switch {
	case f.URL == "":
		return nil
	case f.EndpointURL:
		return fmt.Errorf("%w: a url and the endpoint's url both given: choose one", ErrRetarget)
	case f.Endpoint == "" && len(f.EventIDs) == 0:
		return fmt.Errorf("%w: a url is for one endpoint's events (an endpoint or event ids), not every endpoint's", ErrRetarget)
	}
	if err := config.ValidateURL(f.URL); err != nil {
		return fmt.Errorf("%w: url: %v", ErrRetarget, err)
	}
	if macro.Contains(f.URL) {
		if _, err := macro.Parse(f.URL, true); err != nil {
			return fmt.Errorf("%w: url: %v", ErrRetarget, err)
		}
	}
	return nil
}

// Pause holds endpoint's deliveries until until, or until Resume when until
// is zero (its paused_until is then postboxtype.PauseIndefinite), on every
// instance. Nothing is dropped: its events are ingested
// and wait in the queue without spending attempts. It replaces any pause
// the endpoint has; a receiver's Retry-After while it lasts can extend it,
// never shorten it. Instances hear of it at once; an attempt one of them
// had already started finishes.
func Pause(ctx context.Context, pool *pgxpool.Pool, endpoint string, until time.Time) error {
	s := &store.Store{Pool: pool}
	return s.Pause(ctx, endpoint, until)
}

// Resume ends endpoint's pause (an operator's or a receiver's), and the
// instances claim its deliveries at once.
func Resume(ctx context.Context, pool *pgxpool.Pool, endpoint string) error {
	s := &store.Store{Pool: pool}
	return s.Resume(ctx, endpoint)
}
