package store

import (
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Transient reports whether err is one that waiting can cure: the server
// is unreachable, starting, shutting down or out of connections, the
// connection broke, the database is read-only for the moment, or the
// transaction lost a conflict. Errors of configuration, privilege or SQL
// are not.
func Transient(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if len(pgErr.Code) != 5 {
			return false
		}
		switch pgErr.Code[:2] {
		case "08", "53": // connection exception, insufficient resources
			return true
		}
		switch pgErr.Code {
		case "57P01", "57P02", "57P03", // admin or crash shutdown, starting up
			"25006",          // read_only_sql_transaction
			"40001", "40P01": // serialization failure, deadlock
			return true
		}
		return false
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) || errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		pgconn.SafeToRetry(err) || pgconn.Timeout(err) ||
		strings.Contains(err.Error(), "conn closed")
}
