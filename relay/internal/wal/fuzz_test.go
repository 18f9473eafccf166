package wal

import (
	"context"
	"encoding/binary"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/internal/store"
)

// fuzzTypes are the type names a fuzzed column spec may use; any other
// type is read as a numeric OID (0 when it is not one).
var fuzzTypes = map[string]uint32{
	"int2": pgtype.Int2OID, "int4": pgtype.Int4OID, "int8": pgtype.Int8OID,
	"numeric": pgtype.NumericOID, "float8": pgtype.Float8OID, "bool": pgtype.BoolOID,
	"text": pgtype.TextOID, "varchar": pgtype.VarcharOID, "uuid": pgtype.UUIDOID,
	"json": pgtype.JSONOID, "jsonb": pgtype.JSONBOID, "bytea": pgtype.ByteaOID,
	"timestamptz": pgtype.TimestamptzOID, "timestamp": pgtype.TimestampOID, "date": pgtype.DateOID,
}

// fuzzRelation builds the outbox's Relation message from spec: columns
// separated by commas, each "name:type" or "name:type:flags".
func fuzzRelation(spec string) *pglogrepl.RelationMessage {
	m := &pglogrepl.RelationMessage{RelationID: 16384, Namespace: "public", RelationName: "outbox", ReplicaIdentity: 'd'}
	for _, c := range strings.Split(spec, ",") {
		name, rest, _ := strings.Cut(c, ":")
		typ, flags, _ := strings.Cut(rest, ":")
		oid, ok := fuzzTypes[typ]
		if !ok {
			n, _ := strconv.ParseUint(typ, 10, 32)
			oid = uint32(n)
		}
		f, _ := strconv.ParseUint(flags, 10, 8)
		m.Columns = append(m.Columns, &pglogrepl.RelationMessageColumn{
			Flags: uint8(f), Name: strings.ReplaceAll(name, "\x00", ""), DataType: oid, TypeModifier: -1,
		})
	}
	m.ColumnNum = uint16(len(m.Columns))
	return m
}

// fuzzTuple builds an insert's tuple from spec: columns separated by
// newlines, each a kind byte and its data: "t42" is text, "b…" binary,
// "n" NULL, "u" an unchanged TOAST value; any other kind byte is sent
// as it is, without data.
func fuzzTuple(spec string) *pglogrepl.TupleData {
	t := &pglogrepl.TupleData{}
	for _, c := range strings.Split(spec, "\n") {
		col := &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeText}
		if c != "" {
			col.DataType = c[0]
			c = c[1:]
		}
		if col.DataType == pglogrepl.TupleDataTypeText || col.DataType == pglogrepl.TupleDataTypeBinary {
			col.Data, col.Length = []byte(c), uint32(len(c))
		}
		t.Columns = append(t.Columns, col)
	}
	t.ColumnNum = uint16(len(t.Columns))
	return t
}

// The wire encodings of pgoutput's messages (protocol version 1).

func encodeBegin(final pglogrepl.LSN) []byte {
	b := []byte{byte(pglogrepl.MessageTypeBegin)}
	b = binary.BigEndian.AppendUint64(b, uint64(final))
	b = binary.BigEndian.AppendUint64(b, 0) // commit time
	return binary.BigEndian.AppendUint32(b, 1234)
}

func encodeCommit(commit, end pglogrepl.LSN) []byte {
	b := []byte{byte(pglogrepl.MessageTypeCommit), 0}
	b = binary.BigEndian.AppendUint64(b, uint64(commit))
	b = binary.BigEndian.AppendUint64(b, uint64(end))
	return binary.BigEndian.AppendUint64(b, 0)
}

func encodeRelation(m *pglogrepl.RelationMessage) []byte {
	b := []byte{byte(pglogrepl.MessageTypeRelation)}
	b = binary.BigEndian.AppendUint32(b, m.RelationID)
	b = append(append(b, m.Namespace...), 0)
	b = append(append(b, m.RelationName...), 0)
	b = append(b, m.ReplicaIdentity)
	b = binary.BigEndian.AppendUint16(b, uint16(len(m.Columns)))
	for _, c := range m.Columns {
		b = append(b, c.Flags)
		b = append(append(b, c.Name...), 0)
		b = binary.BigEndian.AppendUint32(b, c.DataType)
		b = binary.BigEndian.AppendUint32(b, uint32(c.TypeModifier))
	}
	return b
}

func encodeInsert(relID uint32, t *pglogrepl.TupleData) []byte {
	b := []byte{byte(pglogrepl.MessageTypeInsert)}
	b = binary.BigEndian.AppendUint32(b, relID)
	b = append(b, 'N')
	b = binary.BigEndian.AppendUint16(b, uint16(len(t.Columns)))
	for _, c := range t.Columns {
		b = append(b, c.DataType)
		if c.DataType == pglogrepl.TupleDataTypeText || c.DataType == pglogrepl.TupleDataTypeBinary {
			b = binary.BigEndian.AppendUint32(b, uint32(len(c.Data)))
			b = append(b, c.Data...)
		}
	}
	return b
}

// dropColumn is m without its column i, as pgoutput describes a relation
// after ALTER TABLE … DROP COLUMN.
func dropColumn(m *pglogrepl.RelationMessage, i int) *pglogrepl.RelationMessage {
	out := *m
	out.Columns = append(append([]*pglogrepl.RelationMessageColumn{}, m.Columns[:i]...), m.Columns[i+1:]...)
	out.ColumnNum = uint16(len(out.Columns))
	return &out
}

// dropTupleColumn is t without its column i (when it has one).
func dropTupleColumn(t *pglogrepl.TupleData, i int) *pglogrepl.TupleData {
	if i >= len(t.Columns) {
		return t
	}
	out := *t
	out.Columns = append(append([]*pglogrepl.TupleDataColumn{}, t.Columns[:i]...), t.Columns[i+1:]...)
	out.ColumnNum = uint16(len(out.Columns))
	return &out
}

// FuzzDecodeRow streams one transaction through a session: a Relation
// message for the outbox built from columns (contract columns, others,
// some missing, any type), an insert whose tuple is built from tuple,
// and, when drop is not zero, a second Relation message without one
// column (a dropped column) and an insert shaped like it. Whatever the
// columns and values, no row is lost and each either says why it is
// invalid or has an event id and an endpoint the row carried.
func FuzzDecodeRow(f *testing.F) {
	table, err := outbox.ParseTable("public.outbox")
	require.NoError(f, err)

	f.Fuzz(func(t *testing.T, columns, tuple string, drop uint8) {
		rel, tup := fuzzRelation(columns), fuzzTuple(tuple)
		if len(rel.Columns) > 1<<12 || len(tup.Columns) > 1<<12 {
			t.Skip("wider than a table can be")
		}
		type insert struct {
			rel *pglogrepl.RelationMessage
			tup *pglogrepl.TupleData
		}
		inserts := []insert{{rel, tup}}
		msgs := [][]byte{encodeBegin(0x16B3748), encodeRelation(rel), encodeInsert(rel.RelationID, tup)}
		if drop > 0 {
			i := int(drop-1) % len(rel.Columns)
			rel2, tup2 := dropColumn(rel, i), dropTupleColumn(tup, i)
			if len(tup2.Columns) == 0 {
				// pglogrepl cannot parse an insert of no columns (a table
				// whose every column was dropped): not an outbox.
				t.Skip("no column left")
			}
			inserts = append(inserts, insert{rel2, tup2})
			msgs = append(msgs, encodeRelation(rel2), encodeInsert(rel2.RelationID, tup2))
		}
		msgs = append(msgs, encodeCommit(0x16B3748, 0x16B3780))

		out := NewQueue[struct{}](ChunkRowsDefault, ChunkBytesDefault)
		ss := &session[struct{}]{
			opts:  Options[struct{}]{Table: table}.WithDefaults(),
			out:   out,
			rels:  map[uint32]*relation{},
			types: pgtype.NewMap(),
		}
		for _, m := range msgs {
			require.NoError(t, ss.logical(context.Background(), m))
		}
		out.Close()
		var rows []store.OutboxRow
		for {
			chunks, ok := out.Take(context.Background())
			if !ok {
				break
			}
			for _, c := range chunks {
				rows = append(rows, c.Rows...)
			}
		}
		require.Len(t, rows, len(inserts), "every insert into the outbox becomes a row")
		for i, row := range rows {
			if row.Invalid != "" {
				require.True(t, strings.HasPrefix(row.Invalid, "invalid_row: "), "reason %q", row.Invalid)
				continue
			}
			require.NotEmpty(t, row.EventID, "a valid row has an event id")
			// A row without an endpoint is routed by its event type.
			routed := row.Endpoint == "" && row.EventType != "" && carriesText(inserts[i].rel, inserts[i].tup, "event_type", row.EventType)
			require.True(t, routed || carriesText(inserts[i].rel, inserts[i].tup, "endpoint", row.Endpoint),
				"a valid row's endpoint %q is the text of its endpoint column, or it is routed by its event type", row.Endpoint)
			require.True(t, carriesText(inserts[i].rel, inserts[i].tup, "payload", string(row.Payload)),
				"a valid row's payload %q is the text of its payload column", row.Payload)
		}
	})
}

// carriesText reports whether the tuple has a text value v in a column
// named name.
func carriesText(rel *pglogrepl.RelationMessage, tup *pglogrepl.TupleData, name, v string) bool {
	for i, c := range rel.Columns {
		if c.Name == name && i < len(tup.Columns) &&
			tup.Columns[i].DataType == pglogrepl.TupleDataTypeText && string(tup.Columns[i].Data) == v {
			return true
		}
	}
	return false
}
