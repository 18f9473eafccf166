package main

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

// TestConfirmedFlushNeverPassesIngest samples the slot's
// confirmed_flush_lsn every 20 ms while postbox streams under load, while
// its ingest is held up (the stream goes on receiving), and across a
// SIGKILL of the streaming instance and the standby's takeover. It checks
// at every sample that every outbox transaction the slot has confirmed is
// durably ingested: the server may recycle only WAL whose events are
// already in postbox.events.
//
// The checkpoint row itself is not the bound: when nothing is in progress
// the confirmed position follows the server's WAL end (so a quiet outbox
// never pins WAL), past the last outbox commit and so past the
// checkpoint. What may never happen is a confirmed position at or past
// an outbox transaction that is not ingested. The producer notes, after
// each commit, pg_current_wal_insert_lsn(): at or past the commit's end.
// A sample reads the slot first and postbox.events afterwards (a later
// snapshot; ingests are never undone), so every transaction whose noted
// position the confirmed LSN has reached must be found; a race can only
// hide a violation, never invent one.
func TestConfirmedFlushNeverPassesIngest(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	rc := newCounter(t)
	const leaderLease = 2 * time.Second
	leader, cfg := streamingRelay(t, dbURL, pool, "leader_lease: "+leaderLease.String()+"\nendpoints:\n  p:\n    url: "+rc.URL+"\n")
	startPostbox(t, nil, "run", "--config", cfg)
	waitForT(t, 30*time.Second, "the standby to register", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.instances WHERE expires_at > now()`) == 2
	})
	oldPID := slotPID(t, pool)

	prod := produceNoted(t, pool, "p", 10*time.Millisecond)
	smp := sampleConfirmed(t, pool, prod, 20*time.Millisecond)
	waitForT(t, 30*time.Second, "samples under load", func() bool { return smp.checked() >= 20 })
	// An ingest that takes its time (a slow disk, a lock): the stream
	// receives the commits behind it, and none may be confirmed.
	x, _, release := holdIngest(t, pool, "p")
	held := smp.count()
	waitForT(t, 30*time.Second, "samples while the ingest waits", func() bool { return smp.count() >= held+25 })
	release()
	beforeKill := smp.count()
	leader.kill(t)
	waitForT(t, 30*time.Second, "the standby to stream", func() bool {
		pid := slotPID(t, pool)
		return pid != 0 && pid != oldPID
	})
	after := smp.checked()
	waitForT(t, 30*time.Second, "samples after the takeover", func() bool { return smp.checked() >= after+20 })
	prod.finish()
	res := waitAllReceived(t, append(prod.ids(), x), rc, 90*time.Second)
	notes := len(prod.notes())
	waitForT(t, 30*time.Second, "every commit confirmed", func() bool {
		smp.mu.Lock()
		defer smp.mu.Unlock()
		return smp.confirmed == notes || smp.violated > 0
	})
	smp.finish()

	smp.mu.Lock()
	defer smp.mu.Unlock()
	t.Logf("confirmed_flush_lsn sampled %d times (%d while the ingest waited, %d after the kill), %d checked against newly confirmed commits; past the checkpoint row in %d (nothing in progress); sent %d, received %d distinct, %d duplicated",
		smp.samples, beforeKill-held, smp.samples-beforeKill, smp.checks, smp.pastCheckpoint, res.sent, res.received, res.duplicated)
	requireDupsWithin(t, res, defaultLane, "one instance killed")
	require.Zero(t, smp.violated, "the slot confirmed outbox commits that were not ingested, first: %v", smp.violations)
}

// noted is a committed outbox row and a WAL position at or past its
// commit's end.
type noted struct {
	id  string
	pos pglogrepl.LSN
}

// notingProducer is a producer that notes where each commit ended.
type notingProducer struct {
	*producer
	mu    sync.Mutex
	noted []noted
}

func produceNoted(t *testing.T, pool *pgxpool.Pool, endpoint string, every time.Duration) *notingProducer {
	np := &notingProducer{}
	np.producer = produceWith(t, pool, endpoint, every, func(ctx context.Context, id string) error {
		// After the commit: the insert position is at or past its end.
		var pos string
		if err := pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&pos); err != nil {
			return err
		}
		lsn, err := pglogrepl.ParseLSN(pos)
		if err != nil {
			return err
		}
		np.mu.Lock()
		np.noted = append(np.noted, noted{id, lsn})
		np.mu.Unlock()
		return nil
	})
	return np
}

func (np *notingProducer) notes() []noted {
	np.mu.Lock()
	defer np.mu.Unlock()
	return append([]noted(nil), np.noted...)
}

// confirmSampler compares the slot's confirmed position with what is
// ingested, every interval, until finished.
type confirmSampler struct {
	stop, done chan struct{}

	mu             sync.Mutex
	samples        int
	checks         int      // samples that found newly confirmed commits to check
	pastCheckpoint int      // samples whose confirmed LSN was past the checkpoint row
	confirmed      int      // noted commits confirmed and found ingested, in order
	violated       int      // samples that found a confirmed commit not ingested
	violations     []string // the first few
}

func sampleConfirmed(t *testing.T, pool *pgxpool.Pool, np *notingProducer, every time.Duration) *confirmSampler {
	s := &confirmSampler{stop: make(chan struct{}), done: make(chan struct{})}
	ctx := context.Background()
	go func() {
		defer close(s.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
			// The slot first; everything read after it is newer.
			var confText string
			if err := pool.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots
				WHERE database = current_database()`).Scan(&confText); err != nil {
				continue
			}
			conf, err := pglogrepl.ParseLSN(confText)
			if err != nil {
				continue
			}
			notes := np.notes()
			s.mu.Lock()
			from := s.confirmed
			s.mu.Unlock()
			var ids []string
			for _, n := range notes[from:] {
				if n.pos > conf {
					break // commits are in order: the producer waits for each
				}
				ids = append(ids, n.id)
			}
			var found int
			var cpText string
			if err := pool.QueryRow(ctx, `
				SELECT (SELECT count(*) FROM postbox.events WHERE event_id = ANY($1::uuid[])),
				       coalesce((SELECT lsn::text FROM postbox.checkpoints), '0/0')`, ids).Scan(&found, &cpText); err != nil {
				continue
			}
			cp, _ := pglogrepl.ParseLSN(cpText)
			s.mu.Lock()
			s.samples++
			if conf > cp {
				s.pastCheckpoint++
			}
			if len(ids) > 0 {
				s.checks++
			}
			switch {
			case found == len(ids):
				s.confirmed = from + len(ids)
			case len(s.violations) < 5:
				s.violations = append(s.violations, fmt.Sprintf("confirmed_flush_lsn %s (checkpoint %s) covers %d commits up to %s; %d of them are not ingested",
					conf, cp, len(ids), notes[from+len(ids)-1].pos, len(ids)-found))
				fallthrough
			default:
				s.violated++
			}
			s.mu.Unlock()
		}
	}()
	t.Cleanup(s.finish)
	return s
}

func (s *confirmSampler) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples
}

func (s *confirmSampler) checked() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.checks
}

func (s *confirmSampler) finish() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// TestServerCrashBeforeTheIngestIsFlushed crashes PostgreSQL while an
// ingest has committed but its commit is not yet in the server's flushed
// WAL: the ingest commits without waiting for its flush. The server's own
// commits do not wait either (synchronous_commit = off, which the relay
// must be safe on), and its WAL writer flushes only every 10 s: nothing
// but the test's own insert, which waits, and the relay's flush at the
// start of a session flush the WAL in between. The slot must not be
// confirmed past the event's transaction meanwhile; the crash undoes the
// ingest, and the event comes through the stream again and is delivered.
//
// A round counts when the crash did undo the ingest (the event's row is
// gone, or written again by a later ingest): it was unflushed then, and
// so at every sample before. The WAL writer may have written it (not
// flushed: a crash of the server alone keeps what was written) or flushed
// it first; such a round is tried again.
func TestServerCrashBeforeTheIngestIsFlushed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster, dbURL, pool := ownServer(t, map[string]string{"wal_writer_delay": "10s", "synchronous_commit": "off"}, "unflushed")
	rc := newCounter(t)
	// The receiver holds every request until released: a first attempt
	// that ended would have its outcome written, by a commit that flushes.
	hold := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(hold) }) }
	t.Cleanup(release)
	rc.onRecv = func(int) { <-hold }
	streamingRelay(t, dbURL, pool, "leader_lease: 60s\nendpoints:\n  p:\n    url: "+rc.URL+"\n    timeout: 120s\n")

	lsnOf := func(sql string, args ...any) (pglogrepl.LSN, error) {
		var text string
		if err := pool.QueryRow(ctx, sql, args...).Scan(&text); err != nil {
			return 0, err
		}
		return pglogrepl.ParseLSN(text)
	}
	var sent []string
	exercised, rounds := 0, 0
	for round := 1; round <= 8 && exercised == 0; round++ {
		// Start just after the WAL writer's turn, which flushes what
		// the commits before left: the next comes 10 s later. (The
		// pool may hold connections the last crash broke: each fails
		// once.)
		rounds = round
		var tick pglogrepl.LSN
		waitForT(t, 60*time.Second, "the WAL writer's turn", func() bool {
			if tick == 0 {
				if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS tick (at timestamptz); INSERT INTO tick VALUES (now())`); err != nil {
					return false
				}
				tick, _ = lsnOf(`SELECT pg_current_wal_insert_lsn()::text`)
				return false
			}
			flushed, err := lsnOf(`SELECT pg_current_wal_flush_lsn()::text`)
			return err == nil && flushed >= tick
		})
		id := outbox.NewEventID()
		// The event's commit waits for its flush, or the walsender
		// would not see it before the WAL writer's next turn.
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = on`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO postbox.outbox (event_id, endpoint) VALUES ($1, 'p')`, id)
			return err
		}))
		sent = append(sent, id)
		var commit pglogrepl.LSN
		var ingestedAt time.Time
		waitForT(t, 30*time.Second, "the event to be ingested", func() bool {
			var text string
			err := pool.QueryRow(ctx, `SELECT commit_lsn::text, ingested_at FROM postbox.events WHERE event_id = $1`, id).Scan(&text, &ingestedAt)
			if err != nil {
				return false
			}
			commit, err = pglogrepl.ParseLSN(text)
			return err == nil
		})
		// A relay that confirmed what it ingested at once would do so
		// within a status update (50-100 ms).
		var confirmed pglogrepl.LSN
		for range 15 {
			conf, err := lsnOf(`SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE database = current_database()`)
			require.NoError(t, err)
			confirmed = max(confirmed, conf)
			time.Sleep(20 * time.Millisecond)
		}
		require.NoError(t, cluster.Kill(pgtest.Immediate))
		require.NoError(t, cluster.StartAgain(ctx))
		var again time.Time
		waitForT(t, 60*time.Second, "the event to be ingested after the crash", func() bool {
			return pool.QueryRow(ctx, `SELECT ingested_at FROM postbox.events WHERE event_id = $1`, id).Scan(&again) == nil
		})
		undone := !again.Equal(ingestedAt)
		t.Logf("round %d: event's commit at %s, slot confirmed up to %s before the crash; ingest undone by the crash: %v",
			round, commit, confirmed, undone)
		if undone {
			exercised++
			require.LessOrEqual(t, confirmed, commit,
				"the slot was confirmed past a transaction whose ingest the server had not flushed")
		}
	}
	require.Positive(t, exercised, "no round crashed the server before the ingest was flushed")
	release()
	res := waitAllDelivered(t, pool, sent, rc)
	t.Logf("sent %d, received %d distinct, %d duplicated", res.sent, res.received, res.duplicated)
	requireDupsWithin(t, res, rounds*defaultLane, "one crash a round")
}
