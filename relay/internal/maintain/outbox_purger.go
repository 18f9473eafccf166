package maintain

import (
	"context"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/postbox-relay/postbox/relay/internal/service"
	"github.com/postbox-relay/postbox/relay/internal/store"
)

// Outbox purge cadence and bounds.
const (
	// OutboxPurgeIntervalDefault is how often ingested outbox rows are
	// purged.
	OutboxPurgeIntervalDefault = 10 * time.Second
	// PurgeWindowDefault is how many outbox rows one statement of the
	// purge looks at; PurgeWindowsDefault how many such statements one
	// purge runs at most: a retained outbox filling at up to their product
	// per OutboxPurgeIntervalDefault (10,000 rows a second) is kept to its
	// retention.
	PurgeWindowDefault  = 5000
	PurgeWindowsDefault = 20
)

// outboxPurger deletes ingested outbox rows past outbox_retention. With
// outbox_retention 0 the ingest deletes the rows it ingests, but an
// application's commit can be streamed a moment before it becomes visible
// to other sessions, and the delete then misses its row: the purge picks
// such rows up.
//
// A row is ingested when its event is in postbox.events, or, once the
// event is purged (event_retention shorter than outbox_retention, or as
// short), when the horizon the last purge took proves it (see
// store.OutboxHorizon): without that, such rows would be kept for good.
type outboxPurger struct {
	periodic
	env             *service.Env
	log             zerolog.Logger
	turn            *sync.Mutex // the liveness duties' (see New)
	window, windows int
	from            int64 // where the purge goes on (an outbox id)
	horizon         store.OutboxHorizon
}

func newOutboxPurger(env *service.Env, turn *sync.Mutex) *outboxPurger {
	p := &outboxPurger{env: env, log: env.Logger("maintain"), turn: turn, window: PurgeWindowDefault, windows: PurgeWindowsDefault}
	p.interval = OutboxPurgeIntervalDefault
	return p
}

// Start runs the purge at once, then every interval.
func (p *outboxPurger) Start(ctx context.Context) error { return p.start(ctx, p.purge) }

func (p *outboxPurger) purge(ctx context.Context) {
	p.turn.Lock()
	defer p.turn.Unlock()
	var err error
	p.from, err = purgeOutbox(ctx, p.env.Store, p.env.Config().OutboxRetention, p.from, p.window, p.windows, p.horizon)
	if err != nil && ctx.Err() == nil {
		p.log.Warn().Err(err).Msg("purging the outbox failed")
	}
	// Taken after the purge, used by the next: by then the stream has
	// usually ingested past it.
	if p.horizon, err = p.env.Store.OutboxHorizon(ctx); err != nil && ctx.Err() == nil {
		p.log.Warn().Err(err).Msg("reading the outbox horizon failed")
	}
}

// purgeOutbox purges the outbox window by window from the id after, up
// to windows of them, while each deletes rows and finds more to look at.
// It returns where the next purge goes on: 0 once it reached the rows
// still to be kept, where it stopped otherwise (also after an error). A
// window that deleted nothing ends the purge: the rows there are not
// ingested yet (a backlog the stream has still to bring), and the next
// purge, an interval later, looks at the window after them.
func purgeOutbox(ctx context.Context, st *store.Store, retention time.Duration, after int64, window, windows int, horizon store.OutboxHorizon) (int64, error) {
	for range windows {
		n, next, err := st.PurgeIngestedOutbox(ctx, retention, after, window, horizon)
		if err != nil {
			return after, err
		}
		if after = next; after == 0 || n == 0 {
			break
		}
	}
	return after, nil
}
