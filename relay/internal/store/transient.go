package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

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
			"25P03", "57P05", // the session ended for idling in a transaction, or at all
			"25006",          // read_only_sql_transaction
			"40001", "40P01": // serialization failure, deadlock
			return true
		}
		return false
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) || errors.As(err, &netErr) || connectionEnded(err) ||
		pgconn.SafeToRetry(err) || pgconn.Timeout(err)
}

// Answered reports whether err is the server's answer to a statement (an
// error it sent, other than one that ends the session), so that the
// connection it came on still works. The severity is read unlocalized
// where the server sends it (lc_messages may translate the other).
func Answered(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	sev := cmp.Or(pgErr.SeverityUnlocalized, pgErr.Severity)
	return sev != "FATAL" && sev != "PANIC"
}

// Cause names, in a sentence an operator can act on, the fault of the
// database behind err, or returns "" when err is not one (a bug, a
// constraint, a cancelled context).
func Cause(err error) string {
	if err == nil || errors.Is(err, context.Canceled) {
		return ""
	}
	var pe *PrivilegeError
	if errors.As(err, &pe) {
		// Never "lost": a role set up without it never had it.
		return fmt.Sprintf("permission denied: the role lacks %s, which %s needs: %s", pe.What, pe.Why, pe.Grant)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "25006":
			return "the database is read-only (default_transaction_read_only, or a standby): writes are refused"
		case "53100":
			return "the database server's disk is full"
		case "53200":
			return "the database server is out of memory"
		case "53300", "53400":
			return "the database server has no connection slots left (max_connections)"
		case "57014":
			return "a statement was cancelled: statement_timeout (or lock_timeout) was reached"
		case "55P03":
			return "a lock was not granted in time (lock_timeout)"
		case "57P01", "57P02", "57P03":
			return "the database server is shutting down, restarting or starting up"
		case "25P03":
			return "a session of postbox's was ended by idle_in_transaction_session_timeout: its transaction waited on postbox too long (was the process frozen or starved of CPU?)"
		case "57P05":
			return "a session of postbox's was ended by idle_session_timeout: set it to 0 for postbox's role (ALTER ROLE … SET idle_session_timeout = 0)"
		case "42P01":
			return "a table is missing: was the outbox table dropped or renamed?"
		case "42703":
			return "a column is missing: was the outbox table altered?"
		case "42501":
			return "permission denied: the role lacks a privilege postbox needs (postbox doctor names each, with the GRANT that gives it)"
		}
		if strings.HasPrefix(pgErr.Code, "08") {
			return "the connection to the database broke"
		}
		return ""
	}
	var connectErr *pgconn.ConnectError
	if !errors.As(err, &connectErr) && connectionEnded(err) {
		return "a connection of postbox's ended without a word from the server that postbox could read " +
			"(a restart, pg_terminate_backend, a network fault, or a timeout such as idle_in_transaction_session_timeout while the process was frozen)"
	}
	if Transient(err) || errors.Is(err, context.DeadlineExceeded) {
		return "the database is unreachable or does not answer"
	}
	return ""
}

// connectionEnded reports whether err is an established connection's
// end: a write refused for the reset the server sent (it had closed), a
// read that found the stream closed, or a use of the connection pgx had
// closed on such a failure. The server's last message may have been in
// the socket, unread: pgx's COPY writes its data before it reads the
// answer to its query, and a write that fails closes the connection,
// buffered error and all. (pgx's error for a use of a connection it
// closed is unexported; it says "conn closed", as ErrConnClosed does.)
func connectionEnded(err error) bool {
	return errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "conn closed")
}
