package wal

import (
	"context"
	"errors"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

var errUnexpectedPID = errors.New("pg_backend_pid() did not answer one value")

// weighWalsender gives the session's walsender the nice value of
// Options.WalsenderNice, where the server runs on this machine and postbox
// may (as root, or as PostgreSQL's OS user with CAP_SYS_NICE). It asks the server for
// the walsender's pid and, before it touches the process of that pid
// here, checks that it is this session's walsender (LocalWalsender): a
// server elsewhere numbers its processes on its own. Whatever stops it is
// logged once a session; the stream goes on.
func (ss *session) weighWalsender(ctx context.Context) {
	nice := ss.opts.WalsenderNice
	pid, err := backendPID(ctx, ss.conn)
	if err == nil {
		port := 0 // a Unix socket
		if tcp, ok := ss.conn.Conn().LocalAddr().(*net.TCPAddr); ok {
			port = tcp.Port
		}
		err = LocalWalsender(pid, port)
	}
	if err == nil {
		err = setNice(pid, nice)
	}
	if err != nil {
		ss.log.Warn().Err(err).Int("walsender_nice", nice).Msg("could not weigh the walsender")
		return
	}
	ss.log.Info().Int("pid", pid).Int("walsender_nice", nice).Msg("weighed the walsender")
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

// CPU is a process's time on a CPU and waiting for one, from
// /proc/PID/schedstat, and its nice value (ProcessCPU).
type CPU struct {
	Ran, Waited time.Duration
	Nice        int
}
