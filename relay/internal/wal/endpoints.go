package wal

import (
	"encoding/binary"
	"fmt"
	"strconv"

	"github.com/jackc/pglogrepl"
)

// EndpointChange is an insert, update or delete of a row of
// postbox.endpoints as the stream decoded it: the row's columns as
// PostgreSQL's text output, by name (nil is NULL). A column the update
// left unchanged and TOASTed is absent from Row: the value applied before
// stays (wal knows nothing of endpoints' settings; the ingest parses).
type EndpointChange struct {
	Name string
	// OldName is the name before an update that changed it: that entry
	// goes.
	OldName string
	// Inserted: Row is the whole row; an update's may lack unchanged
	// TOAST columns.
	Inserted bool
	Deleted  bool
	// Revision is the row's revision; of a delete, the deleted row's
	// (the table's replica identity is full).
	Revision int64
	Row      map[string]*string
	// Commit is the commit LSN of the change's transaction.
	Commit pglogrepl.LSN
}

// endpointsRelation reports whether a message's relation (the id after
// its type byte) is postbox.endpoints.
func (ss *session[P]) endpointsRelation(data []byte) bool {
	// One comparison on the outbox's hot path, not a lookup: the id is
	// known from postbox.endpoints' Relation message.
	return ss.endpointsRel != 0 && len(data) >= 5 && binary.BigEndian.Uint32(data[1:5]) == ss.endpointsRel
}

// endpointChange decodes an insert, update or delete of postbox.endpoints
// into the transaction's chunk, and hands it to Options.EndpointChange at
// once: the events decoded after it are prepared under it. Not the hot
// path: pglogrepl parses it.
func (ss *session[P]) endpointChange(data []byte) error {
	if ss.skip {
		return nil
	}
	msg, err := pglogrepl.Parse(data)
	if err != nil {
		return fmt.Errorf("parse %s message of postbox.endpoints: %w", pglogrepl.MessageType(data[0]), err)
	}
	var c EndpointChange
	var rel *relation
	switch m := msg.(type) {
	case *pglogrepl.InsertMessage:
		rel = ss.rels[m.RelationID]
		c.Row, c.Inserted = rel.textRow(m.Tuple), true
	case *pglogrepl.UpdateMessage:
		rel = ss.rels[m.RelationID]
		c.Row = rel.textRow(m.NewTuple)
		if m.OldTuple != nil {
			if old := rel.textRow(m.OldTuple); old["name"] != nil && c.Row["name"] != nil && *old["name"] != *c.Row["name"] {
				c.OldName = *old["name"]
			}
		}
	case *pglogrepl.DeleteMessage:
		rel = ss.rels[m.RelationID]
		c.Row, c.Deleted = rel.textRow(m.OldTuple), true
	default:
		return nil
	}
	if v := c.Row["name"]; v != nil {
		c.Name = *v
	}
	if v := c.Row["revision"]; v != nil {
		c.Revision, _ = strconv.ParseInt(*v, 10, 64)
	}
	if c.Deleted {
		c.Row = nil
	}
	c.Commit = ss.cur.CommitLSN
	ss.cur.EndpointChanges = append(ss.cur.EndpointChanges, c)
	ss.cur.Bytes += 1024
	if ss.opts.EndpointChange != nil {
		ss.opts.EndpointChange(c)
	}
	return nil
}

// textRow is a tuple's columns by name: text values, nil for NULL, and
// absent when unchanged TOAST (or sent in a form not asked for).
func (r *relation) textRow(t *pglogrepl.TupleData) map[string]*string {
	row := map[string]*string{}
	if t == nil {
		return row
	}
	for i, col := range t.Columns {
		if i >= len(r.names) {
			break
		}
		switch col.DataType {
		case pglogrepl.TupleDataTypeNull:
			row[r.names[i]] = nil
		case pglogrepl.TupleDataTypeText:
			s := string(col.Data)
			row[r.names[i]] = &s
		}
	}
	return row
}
