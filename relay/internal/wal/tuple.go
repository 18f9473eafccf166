package wal

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
)

// column is one value of an inserted tuple as pgoutput sends it.
type column struct {
	kind byte   // pglogrepl.TupleDataType…: text, binary, null or unchanged TOAST
	data []byte // a copy of the value; nil when NULL, TOAST, or longer than kept
	size int    // the value's length as sent
}

// over reports whether the value was sent but not kept.
func (c column) over() bool {
	return (c.kind == pglogrepl.TupleDataTypeText || c.kind == pglogrepl.TupleDataTypeBinary) && c.data == nil && c.size > 0
}

var errShortInsert = errors.New("insert message cut short")

// parseInsert reads an Insert message (protocol version 1): the relation
// and the new tuple's columns. A value longer than keep bytes is measured
// and not copied: the message buffer is the only copy of a payload far
// above max_body, and it is released with the next message.
func parseInsert(src []byte, keep int) (uint32, []column, error) {
	// 'I', relation id, 'N', number of columns.
	if len(src) < 8 || src[0] != byte(pglogrepl.MessageTypeInsert) {
		return 0, nil, errShortInsert
	}
	rel := binary.BigEndian.Uint32(src[1:])
	if src[5] != 'N' {
		return 0, nil, fmt.Errorf("insert message: tuple marker %q, not 'N'", src[5])
	}
	n := int(binary.BigEndian.Uint16(src[6:]))
	src = src[8:]
	cols := make([]column, 0, n)
	kept := 0 // bytes of the values kept, copied below into one array
	for range n {
		if len(src) < 1 {
			return 0, nil, errShortInsert
		}
		c := column{kind: src[0]}
		src = src[1:]
		switch c.kind {
		case pglogrepl.TupleDataTypeText, pglogrepl.TupleDataTypeBinary:
			if len(src) < 4 {
				return 0, nil, errShortInsert
			}
			size := binary.BigEndian.Uint32(src)
			src = src[4:]
			if uint64(size) > uint64(len(src)) {
				return 0, nil, errShortInsert
			}
			c.size = int(size)
			if c.size <= keep {
				c.data = src[:c.size:c.size] // the message's, until copied
				kept += c.size
			}
			src = src[c.size:]
		default:
			// NULL, an unchanged TOAST value, or a kind this reader does
			// not know: no data follows, and the value is unreadable.
		}
		cols = append(cols, c)
	}
	// One copy of the values, not one each: the message buffer is reused.
	buf := make([]byte, 0, kept)
	for i := range cols {
		if d := cols[i].data; d != nil {
			off := len(buf)
			buf = append(buf, d...)
			cols[i].data = buf[off:len(buf):len(buf)]
		}
	}
	return rel, cols, nil
}
