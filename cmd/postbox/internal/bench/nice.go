package bench

import (
	"context"
	"fmt"
)

// weighWalsender gives the walsender that streams slot the scheduling
// weight of nice (Options.WalsenderNice).
//
// Why it matters: in the load scenario the producers keep both CPUs busy,
// and the walsender is one process among many that want one. PostgreSQL
// starts each backend in a session of its own, so where the kernel groups
// sessions (sched_autogroup) the walsender weighs as much as any one
// producer's backend, or the relay and the bench together. It decodes
// every WAL record, postbox's own writes too, with a turn of its loop for
// each; beside postbox it needs about the share of a CPU that it gets,
// and whenever it falls behind, the rows committed meanwhile wait (the
// "server's send" of the split). With a larger weight it keeps up. The
// relay cannot do this for itself: the walsender is the server's process,
// and the weight is the operator's to give (docs/operations.md).
func (e *env) weighWalsender(ctx context.Context, slot string, nice int) error {
	var pid *int32
	if err := e.pool.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&pid); err != nil {
		return fmt.Errorf("walsender-nice: find the walsender of slot %s: %w", slot, err)
	}
	if pid == nil {
		return fmt.Errorf("walsender-nice: slot %s has no walsender", slot)
	}
	if err := setNice(int(*pid), nice); err != nil {
		return fmt.Errorf("walsender-nice: the walsender (pid %d) must run on this machine and be the bench's to reweigh: %w", *pid, err)
	}
	fmt.Fprintf(e.log, "bench: the walsender of slot %s (pid %d) at nice %d\n", slot, *pid, nice)
	return nil
}
