package wal

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/rs/zerolog"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/internal/store"
)

// Chunk is consecutive rows of one committed transaction, in order. A
// transaction larger than the chunk limits arrives as several chunks; its
// last has Final set and the commit's positions.
type Chunk[P any] struct {
	Rows       []store.OutboxRow
	Final      bool
	CommitLSN  pglogrepl.LSN
	EndLSN     pglogrepl.LSN // the checkpoint once this transaction is ingested
	CommitTime time.Time
	Bytes      int
	// Received is when the stream had the chunk: its Commit message's
	// arrival, or for a part of a larger transaction, the moment it filled.
	Received time.Time
	// Sent, on a transaction's final chunk, is when the server sent its
	// Commit message, on the server's clock (the commit time's): from
	// CommitTime to Sent is the server's share of the wait (the commit's
	// WAL flush, the walsender's turn and its decoding), from Sent to
	// Received the network's and the stream's.
	Sent time.Time
	// TxRows, on a transaction's final chunk, counts the outbox rows of
	// all its chunks.
	TxRows int
	// EndpointChanges are the transaction's changes to postbox.endpoints
	// in this chunk, in stream order (Options.EndpointsPublication).
	EndpointChanges []EndpointChange
	// Events counts the events the chunk's rows become: a row routed by
	// subscription one per endpoint matched (store.OutboxRow.Matches). The
	// chunk's and the queue's row bounds count these, so that one ingest
	// of a fan-out holds as many events as one of addressed rows. 0: one
	// a row.
	Events int
	// Prepared is what the consumer decided of the chunk (Options.Prepare,
	// or the consumer as it takes a chunk left unprepared); nil until then.
	Prepared *P
}

// Acker is the consumer's side of the stream: how far everything is
// durably ingested, and when it has finished with all it was sent.
//
// Durable is given how far the server's WAL is known to be flushed, for a
// consumer whose own commits do not wait for their flush: the walsender
// decodes only flushed WAL, so each position it reports (a keepalive's
// WAL end, a message's position) is flushed.
type Acker interface {
	Durable(flushed pglogrepl.LSN) pglogrepl.LSN
	Drained() <-chan struct{}
}

// Options configure a Stream.
type Options[P any] struct {
	ConnString  string
	Slot        string
	Publication string
	Table       outbox.Table
	// StatusInterval is the longest gap between standby status updates;
	// each periodic one asks the server for a reply, so a silent
	// connection is noticed.
	StatusInterval time.Duration
	// StallTimeout ends the session when nothing at all arrives for this
	// long (3 × StatusInterval when zero).
	StallTimeout time.Duration
	// DrainTimeout bounds the wait for the consumer at the end of a
	// session before the final status update.
	DrainTimeout time.Duration
	// MaxBody, when set, is the current max_body: a payload above it is
	// not read (store.OutboxRow.PayloadTooLarge).
	MaxBody    func() int
	ChunkRows  int // ChunkRowsDefault when zero
	ChunkBytes int // ChunkBytesDefault when zero
	Logger     zerolog.Logger
	// Flushed, when set, is called with each flushed position reported to
	// the server.
	Flushed func(pglogrepl.LSN)
	// Prepare, when set, is called with a chunk as it is complete, in the
	// stream's goroutine, before the chunk is queued, while fewer than
	// PrepareAheadRows rows are queued (the consumer keeps pace): its
	// work that needs no database (starting first attempts) starts at
	// once, not after the ingest of what it took last. It may set
	// Chunk.Prepared. Behind a backlog, chunks are left for the consumer
	// to prepare as it takes them: prepared early, they would hold their
	// decisions and memory while they wait. A chunk prepared is always
	// queued, if need be beyond the queue's bounds when the session ends
	// while it waits.
	Prepare func(*Chunk[P])
	// EndpointsPublication, when set, is the publication of
	// postbox.endpoints (EndpointsPublication), streamed beside the
	// outbox's: its changes come in Chunk.EndpointChanges, and each is
	// given to EndpointChange as it is decoded, before the events after it
	// are prepared. Decoded is given each transaction's commit LSN once
	// all of it is decoded, before its final chunk is prepared.
	EndpointsPublication string
	EndpointChange       func(EndpointChange)
	Decoded              func(commit pglogrepl.LSN)
	// Route, when set, is called with each valid row whose endpoint is
	// NULL as it is decoded, in the stream's goroutine and so in stream
	// order: it finds the endpoints subscribed to the row's event type
	// under the endpoint changes applied up to that point of the stream
	// (store.OutboxRow.Matches), not under those that come after it.
	Route func(*store.OutboxRow)
	// WalsenderNice, when not zero, is the nice value each session gives
	// its walsender before it starts replication (weighWalsender): where
	// the database's CPUs run saturated, the walsender otherwise waits its
	// turn beside every backend, and the rows committed meanwhile with it.
	WalsenderNice int
}

// Stream reads outbox inserts from a logical replication slot.
type Stream[P any] struct {
	opts Options[P]
}

// Defaults of Options.
const (
	StatusIntervalDefault = 10 * time.Second
	DrainTimeoutDefault   = 30 * time.Second
	ChunkRowsDefault      = 1000
	ChunkBytesDefault     = 1 << 20
	// PrepareAheadRows is the queue's length (in rows) below which the
	// stream prepares chunks itself (Options.Prepare). The walsender sends
	// in bursts, so a few hundred rows queue behind an ingest's write
	// without the ingest falling behind (docs/benchmarks.md); a catch-up
	// keeps the queue full, far above it.
	PrepareAheadRows = 256
)

// minKeep is the length up to which the stream reads any column's value,
// whatever max_body: a url, headers or an event type longer than this (or
// than max_body if larger) make the row invalid rather than fill memory.
const minKeep = 64 << 10

func (o Options[P]) maxBody() int {
	if o.MaxBody == nil {
		return 0
	}
	return o.MaxBody()
}

// WithDefaults fills unset options from the …Default constants (a stall
// timeout of three status intervals).
func (o Options[P]) WithDefaults() Options[P] {
	if o.StatusInterval <= 0 {
		o.StatusInterval = StatusIntervalDefault
	}
	if o.StallTimeout <= 0 {
		o.StallTimeout = 3 * o.StatusInterval
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = DrainTimeoutDefault
	}
	if o.ChunkRows <= 0 {
		o.ChunkRows = ChunkRowsDefault
	}
	if o.ChunkBytes <= 0 {
		o.ChunkBytes = ChunkBytesDefault
	}
	return o
}

// NewStream returns a Stream.
func NewStream[P any](opts Options[P]) *Stream[P] { return &Stream[P]{opts: opts.WithDefaults()} }

// Session describes a started replication session.
type Session struct {
	SystemID string
	Timeline int32
	XLogPos  pglogrepl.LSN
	// Walsender is the server process that streams the session.
	Walsender Walsender
}

// Plan decides, once the server has identified itself, where a session
// starts and which transactions it drops as already ingested (those whose
// commit lies before skipBefore).
type Plan func(s Session) (start, skipBefore pglogrepl.LSN, err error)

// Run streams one session: it connects, identifies the server, asks plan
// where to start, starts replication, and puts each committed
// transaction's outbox rows on out, dropping those plan says were
// ingested already. It answers
// keepalives, reports ack.Durable as flushed, and, when nothing is in
// progress, lets the flushed position follow the server's WAL end so a
// quiet outbox never pins WAL.
//
// Run returns when ctx is cancelled (nil) or the session fails. Either way
// it closes out, waits for ack.Drained(), reports the final position and
// closes the connection. started, when not nil, is called once replication
// has started.
func (s *Stream[P]) Run(ctx context.Context, plan Plan, out *Queue[P], ack Acker, started func(Session)) error {
	conn, err := connect(ctx, s.opts.ConnString)
	if err != nil {
		out.Close()
		return err
	}
	ss := &session[P]{
		opts:  s.opts,
		conn:  conn,
		out:   out,
		ack:   ack,
		rels:  map[uint32]*relation{},
		types: pgtype.NewMap(),
		log:   s.opts.Logger,
	}
	err = ss.run(ctx, plan, started)
	out.Close()
	// Let the consumer finish what it was sent, then confirm it.
	select {
	case <-ack.Drained():
	case <-time.After(s.opts.DrainTimeout):
		ss.log.Warn().Msg("ingest did not drain in time; confirming what is durable")
	}
	if !conn.IsClosed() {
		if err := ss.sendStatus(true); err == nil {
			ss.log.Debug().Stringer("flushed", ss.lastFlush).Msg("final standby status sent")
		}
	}
	closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = conn.Close(closeCtx)
	cancel()
	return err
}

type session[P any] struct {
	opts       Options[P]
	conn       *pgconn.PgConn
	out        *Queue[P]
	ack        Acker
	log        zerolog.Logger
	skipBefore pglogrepl.LSN
	rels       map[uint32]*relation
	// endpointsRel is postbox.endpoints' relation id (0 until its
	// Relation message).
	endpointsRel uint32
	types        *pgtype.Map // decodes column values by type OID; the session's own (a Map is not safe for concurrent use)

	inTx bool // between Begin and Commit
	skip bool // the current transaction was ingested before
	rows int  // the current transaction's outbox rows so far
	cur  Chunk[P]
	sent time.Time // when the server sent the last XLogData message (its clock)

	sentEnd pglogrepl.LSN // end of the last transaction sent
	// serverEnd is the furthest position the server reported, in a
	// keepalive's WAL end or a message's: its WAL is flushed that far.
	serverEnd  pglogrepl.LSN
	lastFlush  pglogrepl.LSN // last flushed position reported
	lastStatus time.Time
	lastRecv   time.Time
}

func (ss *session[P]) run(ctx context.Context, plan Plan, started func(Session)) error {
	sys, err := pglogrepl.IdentifySystem(ctx, ss.conn)
	if err != nil {
		return fmt.Errorf("identify system: %w", err)
	}
	walsender, lookup := ss.walsender(ctx)
	if lookup != nil && ss.opts.WalsenderNice == 0 {
		ss.log.Debug().Err(lookup).Msg("the walsender's pid is unknown: no telemetry of its CPU")
	}
	info := Session{SystemID: sys.SystemID, Timeline: sys.Timeline, XLogPos: sys.XLogPos, Walsender: walsender}
	start, skipBefore, err := plan(info)
	if err != nil {
		return err
	}
	ss.skipBefore = skipBefore
	if ss.opts.WalsenderNice != 0 {
		ss.weighWalsender(info.Walsender, lookup)
	}
	pubs := ss.opts.Publication // validated: [a-z0-9_]
	if ss.opts.EndpointsPublication != "" {
		pubs += "," + ss.opts.EndpointsPublication
	}
	args := []string{
		"proto_version '1'",
		"publication_names '" + pubs + "'",
		// Asked for whatever outbox_messages says: with messages off, an
		// event written with outbox.Emit is recorded as a dead letter
		// (messages_off), to replay once they are on, never dropped.
		"messages 'true'",
	}
	if err := pglogrepl.StartReplication(ctx, ss.conn, ss.opts.Slot, start,
		pglogrepl.StartReplicationOptions{Mode: pglogrepl.LogicalReplication, PluginArgs: args}); err != nil {
		return classify(fmt.Errorf("start replication on slot %s: %w", ss.opts.Slot, err))
	}
	ss.lastFlush = start
	ss.lastStatus, ss.lastRecv = time.Now(), time.Now()
	if started != nil {
		started(info)
	}
	var wake wakeContext
	defer wake.stop()
	for {
		if err := ss.sendStatus(false); err != nil {
			return err
		}
		msg, err := ss.conn.ReceiveMessage(wake.by(ctx, ss.nextWake()))
		if err != nil {
			if ctx.Err() != nil {
				return nil // shutting down: stop reading
			}
			if pgconn.Timeout(err) {
				if time.Since(ss.lastRecv) > ss.opts.StallTimeout {
					return fmt.Errorf("%w: nothing received for %s", ErrStalled, time.Since(ss.lastRecv).Round(time.Second))
				}
				continue
			}
			return fmt.Errorf("receive: %w", err)
		}
		ss.lastRecv = time.Now()
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if err := ss.handle(ctx, m.Data); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
		case *pgproto3.ErrorResponse:
			return classify(fmt.Errorf("replication: %w", pgconn.ErrorResponseToPgError(m)))
		case *pgproto3.CopyDone:
			return errors.New("replication: the server ended the stream")
		}
	}
}

// wakeContext is the receive loop's context: it ends at the wake it was
// made for, and serves every receive until then unless an earlier wake is
// due. A context and its timer per message cost a catch-up more than
// parsing the message.
type wakeContext struct {
	ctx    context.Context
	cancel context.CancelFunc
	at     time.Time
}

// by returns a context of parent that ends no later than at.
func (w *wakeContext) by(parent context.Context, at time.Time) context.Context {
	if w.ctx == nil || w.ctx.Err() != nil || at.Before(w.at) {
		w.stop()
		w.at = at
		w.ctx, w.cancel = context.WithDeadline(parent, at)
	}
	return w.ctx
}

func (w *wakeContext) stop() {
	if w.cancel != nil {
		w.cancel()
	}
}

// nextWake is when the receive loop must wake without a message: for the
// periodic status, or soon when a durable position waits to be reported.
func (ss *session[P]) nextWake() time.Time {
	next := ss.lastStatus.Add(ss.opts.StatusInterval)
	if ss.sentEnd > ss.lastFlush {
		if soon := time.Now().Add(100 * time.Millisecond); soon.Before(next) {
			next = soon
		}
	}
	return next
}

// sendStatus reports the flushed position when forced, due, or advanced.
// A periodic (due) update asks the server to reply, which is how a stalled
// connection is detected.
func (ss *session[P]) sendStatus(force bool) error {
	durable := ss.ack.Durable(ss.serverEnd)
	flush := durable
	if !ss.inTx && durable >= ss.sentEnd && ss.serverEnd > flush {
		flush = ss.serverEnd // nothing in progress: follow the server
	}
	if flush < ss.lastFlush {
		flush = ss.lastFlush
	}
	now := time.Now()
	due := now.Sub(ss.lastStatus) >= ss.opts.StatusInterval
	advanced := flush > ss.lastFlush && now.Sub(ss.lastStatus) >= 50*time.Millisecond
	if !force && !due && !advanced {
		return nil
	}
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), ss.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: flush,
		WALFlushPosition: flush,
		WALApplyPosition: flush,
		ClientTime:       now,
		ReplyRequested:   due,
	})
	if err != nil {
		return fmt.Errorf("send standby status: %w", err)
	}
	ss.lastStatus, ss.lastFlush = now, flush
	if ss.opts.Flushed != nil {
		ss.opts.Flushed(flush)
	}
	return nil
}

func (ss *session[P]) handle(ctx context.Context, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		pkm, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("parse keepalive: %w", err)
		}
		if pkm.ServerWALEnd > ss.serverEnd {
			ss.serverEnd = pkm.ServerWALEnd
		}
		if pkm.ReplyRequested {
			return ss.sendStatus(true)
		}
		return nil
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("parse XLogData: %w", err)
		}
		ss.sent = xld.ServerTime
		ss.serverEnd = max(ss.serverEnd, xld.WALStart)
		return ss.logical(ctx, xld.WALData)
	}
	return nil
}

func (ss *session[P]) logical(ctx context.Context, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch pglogrepl.MessageType(data[0]) {
	case pglogrepl.MessageTypeBegin, pglogrepl.MessageTypeCommit, pglogrepl.MessageTypeRelation:
	case pglogrepl.MessageTypeInsert:
		if ss.endpointsRelation(data) {
			return ss.endpointChange(data)
		}
		return ss.insert(ctx, data)
	case pglogrepl.MessageTypeUpdate, pglogrepl.MessageTypeDelete:
		if ss.endpointsRelation(data) {
			return ss.endpointChange(data)
		}
		return nil
	case pglogrepl.MessageTypeMessage:
		return ss.message(ctx, data)
	default:
		// Truncate, Type, Origin, and the outbox's updates: not ours to
		// deliver; the position still advances with the commit or the
		// keepalive that follows.
		return nil
	}
	msg, err := pglogrepl.Parse(data)
	if err != nil {
		return fmt.Errorf("parse %s message: %w", pglogrepl.MessageType(data[0]), err)
	}
	switch m := msg.(type) {
	case *pglogrepl.RelationMessage:
		rel := newRelation(m, ss.opts.Table, ss.types)
		ss.rels[m.RelationID] = rel
		if rel.endpoints {
			ss.endpointsRel = m.RelationID
		}
	case *pglogrepl.BeginMessage:
		ss.inTx = true
		ss.skip = m.FinalLSN < ss.skipBefore
		ss.cur = Chunk[P]{CommitLSN: m.FinalLSN, CommitTime: m.CommitTime}
		ss.rows = 0
	case *pglogrepl.CommitMessage:
		ss.inTx = false
		if ss.skip {
			ss.skip = false
			return nil
		}
		if ss.opts.Decoded != nil {
			ss.opts.Decoded(m.CommitLSN)
		}
		c := ss.cur
		ss.cur = Chunk[P]{}
		c.Final, c.EndLSN, c.CommitLSN, c.CommitTime = true, m.TransactionEndLSN, m.CommitLSN, m.CommitTime
		c.Received, c.Sent, c.TxRows = time.Now(), ss.sent, ss.rows
		if err := ss.send(ctx, c); err != nil {
			return err
		}
		ss.sentEnd = m.TransactionEndLSN
	}
	return nil
}

// insert adds an inserted outbox row to the transaction's chunk, sending
// the chunk on when it is full.
func (ss *session[P]) insert(ctx context.Context, data []byte) error {
	if ss.skip {
		return nil
	}
	maxBody := ss.opts.maxBody()
	relID, tuple, err := parseInsert(data, max(maxBody, minKeep))
	if err != nil {
		return err
	}
	rel, ok := ss.rels[relID]
	if !ok {
		return fmt.Errorf("insert for relation %d before its Relation message", relID)
	}
	if !rel.outbox {
		return nil
	}
	row := rel.decode(tuple, ss.cur.CommitLSN, maxBody)
	if row.Fanout && row.Invalid == "" && ss.opts.Route != nil {
		ss.opts.Route(&row)
	}
	return ss.add(ctx, row)
}

// add appends a row to the transaction's chunk, sending the chunk on when
// it is full.
func (ss *session[P]) add(ctx context.Context, row store.OutboxRow) error {
	ss.cur.Rows = append(ss.cur.Rows, row)
	ss.rows++
	// A routed row weighs as the events it becomes (Chunk.Events).
	n := max(len(row.Matches), 1)
	ss.cur.Events += n
	ss.cur.Bytes += (len(row.Payload) + len(row.Headers) + 200) * n
	if ss.cur.Events >= ss.opts.ChunkRows || ss.cur.Bytes >= ss.opts.ChunkBytes {
		part := ss.cur
		part.Received = time.Now()
		// The transaction is a large one: its next part is likely full too.
		ss.cur = Chunk[P]{CommitLSN: part.CommitLSN, CommitTime: part.CommitTime, Rows: make([]store.OutboxRow, 0, len(part.Rows))}
		return ss.send(ctx, part)
	}
	return nil
}

// send hands a chunk to the consumer. While the consumer's queue is full it
// keeps the server informed, so a slow ingest does not trip
// wal_sender_timeout.
func (ss *session[P]) send(ctx context.Context, c Chunk[P]) error {
	if ss.opts.Prepare != nil && ss.out.queuedRows() < PrepareAheadRows {
		ss.opts.Prepare(&c)
	}
	if ss.out.put(c, false) {
		return nil
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if ss.out.put(c, false) {
			return nil
		}
		select {
		case <-ss.out.space:
		case <-tick.C:
			if err := ss.sendStatus(false); err != nil {
				return err
			}
			ss.lastRecv = time.Now() // we are the slow side, not the server
		case <-ctx.Done():
			if c.Prepared != nil {
				ss.out.put(c, true) // its attempts started: the consumer finishes them
			}
			return ctx.Err()
		}
	}
}

// relation maps the outbox table's columns, by name, as the latest Relation
// message describes them (an ALTER TABLE sends a new one), and decodes
// their values by the columns' type OIDs.
type relation struct {
	outbox    bool
	endpoints bool // postbox.endpoints
	name      string
	names     []string // the columns' names, in order
	col       map[string]int
	oids      []uint32
	types     *pgtype.Map
}

func newRelation(m *pglogrepl.RelationMessage, t outbox.Table, types *pgtype.Map) *relation {
	r := &relation{
		outbox:    m.Namespace == t.Schema() && m.RelationName == t.Name(),
		endpoints: m.Namespace == "postbox" && m.RelationName == "endpoints",
		name:      m.Namespace + "." + m.RelationName,
		names:     make([]string, len(m.Columns)),
		col:       map[string]int{},
		oids:      make([]uint32, len(m.Columns)),
		types:     types,
	}
	for i, c := range m.Columns {
		r.col[c.Name] = i
		r.names[i] = c.Name
		r.oids[i] = c.DataType
	}
	return r
}

// value is column name's text value in t; ok is false when the column is
// missing or its value was not sent as text.
func (r *relation) value(t []column, name string) (v []byte, oid uint32, null, ok bool) {
	i, ok := r.col[name]
	if !ok || i >= len(t) {
		return nil, 0, false, false
	}
	c := t[i]
	switch {
	case c.kind == pglogrepl.TupleDataTypeNull:
		return nil, r.oids[i], true, true
	case c.kind == pglogrepl.TupleDataTypeText && !c.over():
		return c.data, r.oids[i], false, true
	}
	return nil, 0, false, false
}

// size is the length of column name's value as sent, kept or not.
func (r *relation) size(t []column, name string) int {
	if i, ok := r.col[name]; ok && i < len(t) && t[i].kind == pglogrepl.TupleDataTypeText {
		return t[i].size
	}
	return 0
}

// unread is the length of column name's value when it was sent but too
// long to keep, else 0.
func (r *relation) unread(t []column, name string) int {
	if i, ok := r.col[name]; ok && i < len(t) && t[i].over() {
		return t[i].size
	}
	return 0
}

// timeOID is the type a time column's text is decoded as: its own when it
// is one of PostgreSQL's time types, else (text, a domain, an unknown
// type) timestamptz.
func timeOID(oid uint32) uint32 {
	switch oid {
	case pgtype.TimestamptzOID, pgtype.TimestampOID, pgtype.DateOID:
		return oid
	}
	return pgtype.TimestamptzOID
}

// decodeTime decodes a time column's text value.
func (r *relation) decodeTime(v []byte, oid uint32) (time.Time, error) {
	var t time.Time
	if err := r.types.Scan(timeOID(oid), pgtype.TextFormatCode, v, &t); err != nil {
		return time.Time{}, err
	}
	return t, nil
}

// decode reads an outbox row from the tuple's columns. A payload longer
// than maxBody is left out, its size kept (PayloadTooLarge); another
// column too long to keep makes the row invalid.
func (r *relation) decode(t []column, commit pglogrepl.LSN, maxBody int) store.OutboxRow {
	var row store.OutboxRow
	var missing []string
	text := func(name string) string {
		v, _, null, ok := r.value(t, name)
		if !ok {
			missing = append(missing, name)
		}
		if null || !ok {
			return ""
		}
		return string(v)
	}
	if v, oid, null, ok := r.value(t, "id"); ok && !null {
		// The id only lets postbox delete the row once it is ingested: a
		// table whose id is not an integer still delivers.
		if err := r.types.Scan(oid, pgtype.TextFormatCode, v, &row.OutboxID); err != nil {
			row.OutboxID = 0
		}
	}
	row.EventID = text("event_id")
	endpointNull := false
	if v, _, null, ok := r.value(t, "endpoint"); ok && !null {
		row.Endpoint = string(v)
	} else if ok && null {
		endpointNull = true
	} else {
		missing = append(missing, "endpoint")
	}
	row.URL = text("url")
	row.EventType = text("event_type")
	// NULL routes the row by its event type (Options.Route); without a
	// type there is nothing to route it by.
	row.Fanout = endpointNull
	noRoute := endpointNull && row.EventType == ""
	var badTime error
	if v, oid, null, ok := r.value(t, "created_at"); !ok {
		missing = append(missing, "created_at")
	} else if !null {
		row.CreatedAt, badTime = r.decodeTime(v, oid)
	}
	if n := r.size(t, "payload"); r.unread(t, "payload") > 0 || maxBody > 0 && n > maxBody {
		row.PayloadTooLarge = n
	} else if v, _, null, ok := r.value(t, "payload"); ok && !null {
		row.Payload = v
	} else {
		missing = append(missing, "payload")
		row.Payload = []byte("{}")
	}
	if v, _, null, ok := r.value(t, "headers"); ok && !null {
		row.Headers = v
	}
	if row.EventID == "" {
		// Still give the event a stable identity, so it can be stored,
		// seen and replayed once the table is fixed.
		row.EventID = derivedID(r.name, row.OutboxID, commit)
	}
	// Any other value too long to read makes the row invalid, the
	// optional columns too: a row is not delivered without its url or
	// headers.
	for _, name := range []string{"id", "event_id", "endpoint", "url", "event_type", "created_at", "headers"} {
		if n := r.unread(t, name); n > 0 {
			row.Invalid = fmt.Sprintf("invalid_row: column %s in %s is %d bytes, too long to read", name, r.name, n)
			break
		}
	}
	for _, name := range missing {
		if row.Invalid == "" && name != "url" && name != "headers" && name != "id" {
			row.Invalid = "invalid_row: column " + name + " missing or unreadable in " + r.name
		}
	}
	if row.Invalid == "" && noRoute {
		row.Invalid = "invalid_row: endpoint and event_type are both empty in " + r.name + ": the row names no endpoint and no type to route it by"
	}
	if row.Invalid == "" && badTime != nil {
		row.Invalid = "invalid_row: column created_at in " + r.name + " is not a time: " + badTime.Error()
	}
	return row
}

func derivedID(table string, id int64, lsn pglogrepl.LSN) string {
	h := sha256.Sum256([]byte(fmt.Sprintf("%s/%d/%s", table, id, lsn)))
	h[6] = h[6]&0x0f | 0x50
	h[8] = h[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}
