package wal

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/internal/store"
)

// outboxRelation is the outbox table's columns as a Relation message
// describes them, created_at's type left to the test.
func outboxRelation(createdAtOID uint32) *pglogrepl.RelationMessage {
	return &pglogrepl.RelationMessage{
		RelationID:   16384,
		Namespace:    "public",
		RelationName: "outbox",
		Columns: []*pglogrepl.RelationMessageColumn{
			{Name: "id", DataType: pgtype.Int8OID},
			{Name: "event_id", DataType: pgtype.UUIDOID},
			{Name: "endpoint", DataType: pgtype.TextOID},
			{Name: "url", DataType: pgtype.TextOID},
			{Name: "event_type", DataType: pgtype.TextOID},
			{Name: "payload", DataType: pgtype.JSONBOID},
			{Name: "headers", DataType: pgtype.JSONBOID},
			{Name: "created_at", DataType: createdAtOID},
		},
	}
}

func textCol(s string) *pglogrepl.TupleDataColumn {
	return &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeText, Length: uint32(len(s)), Data: []byte(s)}
}

var nullCol = &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeNull}

// insertTuple is an insert's new tuple, as pgoutput sends it (text
// format), with createdAt as created_at's column.
func insertTuple(createdAt *pglogrepl.TupleDataColumn) *pglogrepl.TupleData {
	cols := []*pglogrepl.TupleDataColumn{
		textCol("42"),
		textCol("0190f3a4-5b6c-7d8e-9f01-23456789abcd"),
		textCol("network"),
		nullCol,
		textCol("conversion"),
		textCol(`{"click_id": "c1"}`),
		nullCol,
		createdAt,
	}
	return &pglogrepl.TupleData{ColumnNum: uint16(len(cols)), Columns: cols}
}

func TestDecodeCreatedAt(t *testing.T) {
	t.Parallel()

	table, err := outbox.ParseTable("public.outbox")
	require.NoError(t, err)
	decode := func(t *testing.T, oid uint32, createdAt *pglogrepl.TupleDataColumn) store.OutboxRow {
		rel := newRelation(outboxRelation(oid), table, pgtype.NewMap())
		require.True(t, rel.outbox)
		_, cols, err := parseInsert(encodeInsert(16384, insertTuple(createdAt)), 1<<20)
		require.NoError(t, err)
		return rel.decode(cols, pglogrepl.LSN(0x16B3748), 1<<20)
	}

	t.Run("timestamptz", func(t *testing.T) {
		t.Parallel()
		row := decode(t, pgtype.TimestamptzOID, textCol("2026-03-01 12:34:56.789012+01"))
		require.Empty(t, row.Invalid)
		require.True(t, row.CreatedAt.Equal(time.Date(2026, 3, 1, 11, 34, 56, 789012000, time.UTC)), "got %s", row.CreatedAt)
		require.Equal(t, int64(42), row.OutboxID)
		require.Equal(t, "0190f3a4-5b6c-7d8e-9f01-23456789abcd", row.EventID)
		require.Equal(t, "network", row.Endpoint)
		require.Empty(t, row.URL)
		require.Equal(t, "conversion", row.EventType)
		require.Equal(t, `{"click_id": "c1"}`, string(row.Payload))
		require.Nil(t, row.Headers)
	})

	t.Run("timestamp without time zone is UTC", func(t *testing.T) {
		t.Parallel()
		row := decode(t, pgtype.TimestampOID, textCol("2026-03-01 12:34:56"))
		require.Empty(t, row.Invalid)
		require.True(t, row.CreatedAt.Equal(time.Date(2026, 3, 1, 12, 34, 56, 0, time.UTC)), "got %s", row.CreatedAt)
	})

	t.Run("text holding a timestamptz", func(t *testing.T) {
		t.Parallel()
		row := decode(t, pgtype.TextOID, textCol("2026-03-01 12:34:56+00"))
		require.Empty(t, row.Invalid)
		require.True(t, row.CreatedAt.Equal(time.Date(2026, 3, 1, 12, 34, 56, 0, time.UTC)), "got %s", row.CreatedAt)
	})

	t.Run("NULL is unknown, not invalid", func(t *testing.T) {
		t.Parallel()
		row := decode(t, pgtype.TimestamptzOID, nullCol)
		require.Empty(t, row.Invalid)
		require.True(t, row.CreatedAt.IsZero())
	})

	t.Run("garbage makes the row invalid", func(t *testing.T) {
		t.Parallel()
		row := decode(t, pgtype.TextOID, textCol("last tuesday"))
		require.True(t, row.CreatedAt.IsZero())
		require.Contains(t, row.Invalid, "invalid_row: column created_at in public.outbox is not a time")
		require.Equal(t, "network", row.Endpoint, "the rest of the row is still decoded")
	})

	t.Run("infinity makes the row invalid", func(t *testing.T) {
		t.Parallel()
		row := decode(t, pgtype.TimestamptzOID, textCol("infinity"))
		require.True(t, row.CreatedAt.IsZero())
		require.Contains(t, row.Invalid, "column created_at in public.outbox is not a time")
	})

	t.Run("unchanged TOAST value is unreadable", func(t *testing.T) {
		t.Parallel()
		row := decode(t, pgtype.TimestamptzOID, &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeToast})
		require.Equal(t, "invalid_row: column created_at missing or unreadable in public.outbox", row.Invalid)
	})
}

// TestDecodeNullEndpoint: a NULL endpoint routes the row by its event
// type; with no type as well the row is invalid, saying so.
func TestDecodeNullEndpoint(t *testing.T) {
	t.Parallel()

	table, err := outbox.ParseTable("public.outbox")
	require.NoError(t, err)
	rel := newRelation(outboxRelation(pgtype.TimestamptzOID), table, pgtype.NewMap())
	decode := func(eventType *pglogrepl.TupleDataColumn) store.OutboxRow {
		tuple := insertTuple(textCol("2026-03-01 12:34:56+00"))
		tuple.Columns[2] = nullCol // endpoint
		tuple.Columns[4] = eventType
		_, cols, err := parseInsert(encodeInsert(16384, tuple), minKeep)
		require.NoError(t, err)
		return rel.decode(cols, pglogrepl.LSN(0x16B3748), 1<<20)
	}

	row := decode(textCol("conversion"))
	require.Empty(t, row.Invalid)
	require.True(t, row.Fanout, "routed by its type")
	require.Empty(t, row.Endpoint)
	require.Equal(t, "conversion", row.EventType)

	for _, col := range []*pglogrepl.TupleDataColumn{nullCol, textCol("")} {
		row = decode(col)
		require.Equal(t, "invalid_row: endpoint and event_type are both empty in public.outbox: the row names no endpoint and no type to route it by", row.Invalid)
		require.Empty(t, row.Endpoint)
		require.Equal(t, "0190f3a4-5b6c-7d8e-9f01-23456789abcd", row.EventID, "the rest of the row is still decoded")
	}
}

// TestOversizedValuesAreNotRead: a payload above max_body is measured, not
// copied, and refused by size; any other column too long to keep makes the
// row invalid; a message cut short is an error, not a panic.
func TestOversizedValuesAreNotRead(t *testing.T) {
	t.Parallel()
	table, err := outbox.ParseTable("public.outbox")
	require.NoError(t, err)
	rel := newRelation(outboxRelation(pgtype.TimestamptzOID), table, pgtype.NewMap())
	big := `{"pad": "` + strings.Repeat("x", 100<<10) + `"}`

	tup := insertTuple(textCol("2026-03-01 12:34:56+00"))
	tup.Columns[5] = textCol(big)
	msg := encodeInsert(16384, tup)
	_, cols, err := parseInsert(msg, minKeep)
	require.NoError(t, err)
	require.Nil(t, cols[5].data, "not copied")
	row := rel.decode(cols, 0x16B3748, 1<<10)
	require.Empty(t, row.Invalid)
	require.Nil(t, row.Payload)
	require.Equal(t, len(big), row.PayloadTooLarge)
	require.Equal(t, "network", row.Endpoint, "the rest of the row is read")

	_, cols, err = parseInsert(msg, 1<<20)
	require.NoError(t, err)
	row = rel.decode(cols, 0x16B3748, 200<<10)
	require.Zero(t, row.PayloadTooLarge, "within max_body")
	require.Equal(t, big, string(row.Payload))

	tup = insertTuple(textCol("2026-03-01 12:34:56+00"))
	tup.Columns[4] = textCol(big) // event_type
	_, cols, err = parseInsert(encodeInsert(16384, tup), minKeep)
	require.NoError(t, err)
	row = rel.decode(cols, 0x16B3748, 1<<10)
	require.Equal(t, fmt.Sprintf("invalid_row: column event_type in public.outbox is %d bytes, too long to read", len(big)), row.Invalid)

	tup = insertTuple(textCol("2026-03-01 12:34:56+00"))
	tup.Columns[6] = textCol(big) // headers: optional, but never dropped unread
	_, cols, err = parseInsert(encodeInsert(16384, tup), minKeep)
	require.NoError(t, err)
	row = rel.decode(cols, 0x16B3748, 1<<20)
	require.Equal(t, fmt.Sprintf("invalid_row: column headers in public.outbox is %d bytes, too long to read", len(big)), row.Invalid)

	for cut := 1; cut < len(msg); cut += 13 {
		_, _, err := parseInsert(msg[:len(msg)-cut], minKeep)
		require.Error(t, err, "cut by %d", cut)
	}
}

// TestParsedValuesOutliveTheMessage: the values are copied out of the
// message buffer, which the connection reuses, and none can grow into the
// next.
func TestParsedValuesOutliveTheMessage(t *testing.T) {
	t.Parallel()
	table, err := outbox.ParseTable("public.outbox")
	require.NoError(t, err)
	rel := newRelation(outboxRelation(pgtype.TimestamptzOID), table, pgtype.NewMap())
	msg := encodeInsert(16384, insertTuple(textCol("2026-03-01 12:34:56+00")))
	_, cols, err := parseInsert(msg, minKeep)
	require.NoError(t, err)
	want := fmt.Sprintf("%+v", rel.decode(cols, 0x16B3748, 1<<20)) // its bytes, printed
	require.Contains(t, want, "network")
	for i := range msg {
		msg[i] = 0xff // the next message
	}
	for i, c := range cols {
		if c.data != nil {
			require.Equal(t, len(c.data), cap(c.data), "column %d", i)
			c.data = append(c.data, '!')
		}
	}
	require.Equal(t, want, fmt.Sprintf("%+v", rel.decode(cols, 0x16B3748, 1<<20)))
}

// TestTheStreamPreparesWhileTheConsumerKeepsPace: a chunk is prepared as
// it is sent while fewer than PrepareAheadRows rows wait for the consumer
// (its first attempts start before the ingest of what is ahead of it);
// behind a backlog it is queued unprepared, for the consumer to prepare
// as it takes it. Once the consumer catches up, chunks are prepared again.
func TestTheStreamPreparesWhileTheConsumerKeepsPace(t *testing.T) {
	prepared := 0
	ss := &session[bool]{out: NewQueue[bool](10*PrepareAheadRows, 1<<30), opts: Options[bool]{Prepare: func(c *Chunk[bool]) {
		prepared++
		c.Prepared = new(true)
	}}}
	ctx := context.Background()
	row := Chunk[bool]{Rows: make([]store.OutboxRow, 1), Final: true}
	for range 2 * PrepareAheadRows {
		require.NoError(t, ss.send(ctx, row))
	}
	require.Equal(t, PrepareAheadRows, prepared, "prepared while fewer than PrepareAheadRows rows were queued")
	took, ok := ss.out.Take(ctx)
	require.True(t, ok)
	require.Len(t, took, 2*PrepareAheadRows)
	for i, c := range took {
		require.Equal(t, i < PrepareAheadRows, c.Prepared != nil, "chunk %d", i)
	}
	require.NoError(t, ss.send(ctx, row))
	require.Equal(t, PrepareAheadRows+1, prepared, "the consumer took the backlog: prepared again")
}
