package wal

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/postbox-relay/postbox/internal/proc"
)

var errUnexpectedPID = errors.New("pg_backend_pid() did not answer one value")

// Walsender is a session's server process: its pid, as the server gave
// it (pg_backend_pid() on the replication connection; 0 when it did not),
// and the port the session's connection comes from (0: a Unix socket),
// by which a process on this machine is told to be it (LocalWalsender).
type Walsender struct {
	PID, ClientPort int
}

// CPU reads the walsender's CPU (proc.ReadCPU) once it has checked that the
// process of its pid here is it: a server elsewhere numbers its processes
// on its own, and the pid of one that ended may be another's now.
func (w Walsender) CPU() (proc.CPU, error) {
	if w.PID == 0 {
		return proc.CPU{}, errNoPID
	}
	if err := LocalWalsender(w.PID, w.ClientPort); err != nil {
		return proc.CPU{}, err
	}
	return proc.ReadCPU(w.PID)
}

var errNoPID = errors.New("the server did not name the walsender")

// walsender asks the server which process is the session's walsender.
// Only what is learned from it (telemetry, weighWalsender) needs the
// answer, so the session goes on without it; the error says why it has
// none (weighWalsender's warning names it).
func (ss *session[P]) walsender(ctx context.Context) (Walsender, error) {
	var w Walsender
	if tcp, ok := ss.conn.Conn().LocalAddr().(*net.TCPAddr); ok {
		w.ClientPort = tcp.Port
	}
	pid, err := backendPID(ctx, ss.conn)
	if err != nil {
		return w, fmt.Errorf("ask for the walsender's pid: %w", err)
	}
	w.PID = pid
	return w, nil
}

// weighWalsender gives the session's walsender w the nice value of
// Options.WalsenderNice, where the server runs on this machine and postbox
// may (as root, or as PostgreSQL's OS user with CAP_SYS_NICE). Before it
// touches the process of w's pid here, it checks that it is this
// session's walsender (LocalWalsender): a server elsewhere numbers its
// processes on its own. Whatever stops it (lookup, walsender's failure to
// learn the pid) is logged once a session; the stream goes on.
func (ss *session[P]) weighWalsender(w Walsender, lookup error) {
	nice := ss.opts.WalsenderNice
	err := lookup
	if err == nil {
		err = errNoPID
		if w.PID != 0 {
			err = LocalWalsender(w.PID, w.ClientPort)
		}
	}
	if err == nil {
		err = proc.SetNice(w.PID, nice)
	}
	if err != nil {
		ss.log.Warn().Err(err).Int("walsender_nice", nice).Msg("could not weigh the walsender")
		return
	}
	ss.log.Info().Int("pid", w.PID).Int("walsender_nice", nice).Msg("weighed the walsender")
}

// backendPID is the pid of the session's server process, its walsender:
// a replication connection to a database takes SQL before it streams.
func backendPID(ctx context.Context, conn *pgconn.PgConn) (int, error) {
	res, err := conn.Exec(ctx, "SELECT pg_backend_pid()").ReadAll()
	if err != nil {
		return 0, err
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 1 {
		return 0, errUnexpectedPID
	}
	return strconv.Atoi(string(res[0].Rows[0][0]))
}

// Starved reports whether a walsender was starved over a span of length
// over in which it ran for ran and waited for a CPU for waited: it was
// busy (on a CPU at least 2% of the span) and waited at least as long as
// it ran. The rows it streams then wait with it.
func Starved(ran, waited, over time.Duration) bool {
	return ran >= over/50 && waited >= ran
}

// StarvedFix is what to do for a starved walsender of nice value nice,
// beside a postbox whose threads are scheduled as batch or not
// (cpu_scheduling): the cheapest remedy first.
func StarvedFix(nice int, batch bool) string {
	if !batch {
		return "schedule postbox's threads as batch, so that they do not preempt the walsender: cpu_scheduling: batch, the default (docs/operations.md, \"postbox's threads as batch\"); then, if need be, walsender_nice: -10 or more CPU for the database"
	}
	if nice < 0 {
		return "give the database more CPU: the walsender is weighed already"
	}
	return "give the database more CPU, or the walsender a weight: walsender_nice: -10 where postbox runs on the database's machine (docs/operations.md, \"Giving the walsender its share\")"
}
