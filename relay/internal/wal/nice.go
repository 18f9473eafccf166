package wal

import (
	"context"
	"errors"
	"strconv"
)

var errUnexpectedPID = errors.New("pg_backend_pid() did not answer one value")

// weighWalsender gives the session's walsender the nice value of
// Options.WalsenderNice, where the server runs on this machine and postbox
// may (as root, or as PostgreSQL's OS user with CAP_SYS_NICE). It asks the server for
// the walsender's pid and, before it touches the process of that pid
// here, checks that it is this session's walsender (walsenderHere): a
// server elsewhere numbers its processes on its own. Whatever stops it is
// logged once a session; the stream goes on unweighed.
func (ss *session) weighWalsender(ctx context.Context) {
	nice := ss.opts.WalsenderNice
	pid, err := backendPID(ctx, ss)
	if err == nil {
		err = walsenderHere(pid, ss.conn.Conn().LocalAddr())
	}
	if err == nil {
		err = setNice(pid, nice)
	}
	if err != nil {
		ss.log.Warn().Err(err).Int("walsender_nice", nice).Msg("the walsender keeps its weight")
		return
	}
	ss.log.Info().Int("pid", pid).Int("walsender_nice", nice).Msg("weighed the walsender")
}

// backendPID is the pid of the session's server process, its walsender:
// a replication connection to a database takes SQL before it streams.
func backendPID(ctx context.Context, ss *session) (int, error) {
	res, err := ss.conn.Exec(ctx, "SELECT pg_backend_pid()").ReadAll()
	if err != nil {
		return 0, err
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 1 {
		return 0, errUnexpectedPID
	}
	return strconv.Atoi(string(res[0].Rows[0][0]))
}
