package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/postbox-relay/postbox/internal/proc"
)

// Options.WalsenderNice, --walsender-nice: why it matters. In the load
// scenario the producers keep both CPUs busy, and the walsender is one
// process among many that want one. PostgreSQL starts each backend in a
// session of its own, so where the kernel groups sessions (autogroups) the
// walsender weighs as much as any one producer's backend, or the relay and
// the bench together. Whenever it falls behind, the rows committed
// meanwhile wait for it (the "server's send" of the split); with a larger
// weight it keeps up. The relay gives its own walsender the weight
// (walsender_nice in its configuration); the bare client's is the bench's
// to give (weighWalsender).

// weighedConfig is the relay's configuration file for the load scenario:
// the bench's, with walsender_nice when nice is not zero.
func (e *env) weighedConfig(nice int) (string, error) {
	if nice == 0 {
		return e.cfgPath, nil
	}
	path := filepath.Join(filepath.Dir(e.cfgPath), "weighed.yaml")
	body, err := os.ReadFile(e.cfgPath)
	if err == nil {
		err = os.WriteFile(path, fmt.Appendf(body, "walsender_nice: %d\n", nice), 0o600)
	}
	if err != nil {
		return "", fmt.Errorf("walsender-nice: write the relay's configuration: %w", err)
	}
	return path, nil
}

// checkWeighed fails unless the relay's walsender has the nice value nice:
// a relay that could not give it says why in its log.
func (e *env) checkWeighed(ctx context.Context, nice int) error {
	pid, err := e.walsenderPID(ctx, e.slot)
	if err != nil {
		return err
	}
	cpu, err := proc.ReadCPU(pid)
	if err != nil {
		return fmt.Errorf("walsender-nice: the walsender (pid %d) must run on this machine: %w", pid, err)
	}
	if got := cpu.Nice; got != nice {
		return fmt.Errorf("walsender-nice: the relay left its walsender (pid %d) at nice %d, not %d (its log says why)", pid, got, nice)
	}
	fmt.Fprintf(e.log, "bench: the relay gave its walsender (pid %d) nice %d\n", pid, nice)
	return nil
}

// weighWalsender gives the walsender that streams slot (the bare
// client's) the scheduling weight of nice.
func (e *env) weighWalsender(ctx context.Context, slot string, nice int) error {
	pid, err := e.walsenderPID(ctx, slot)
	if err != nil {
		return err
	}
	if err := proc.SetNice(pid, nice); err != nil {
		return fmt.Errorf("walsender-nice: the walsender (pid %d) must run on this machine and be the bench's to reweigh: %w", pid, err)
	}
	fmt.Fprintf(e.log, "bench: the walsender of slot %s (pid %d) at nice %d\n", slot, pid, nice)
	return nil
}

func (e *env) walsenderPID(ctx context.Context, slot string) (int, error) {
	var pid *int32
	if err := e.pool.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&pid); err != nil {
		return 0, fmt.Errorf("walsender-nice: find the walsender of slot %s: %w", slot, err)
	}
	if pid == nil {
		return 0, fmt.Errorf("walsender-nice: slot %s has no walsender", slot)
	}
	return int(*pid), nil
}
