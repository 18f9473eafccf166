package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	osproc "github.com/postbox-relay/postbox/internal/proc"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

// TestRunSchedulesItsThreadsAsBatch: every thread of postbox run is
// SCHED_BATCH by default, those the runtime started while it streamed
// included; cpu_scheduling: normal, reloaded, gives them the default
// policy back.
func TestRunSchedulesItsThreadsAsBatch(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	p, cfg := streamingRelay(t, dbURL, pool, "")
	pid := p.cmd.Process.Pid
	require.Equal(t, []int{3}, threadPolicies(t, pid), "SCHED_BATCH (3), every thread")

	body, err := os.ReadFile(cfg)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(cfg, append(body, "cpu_scheduling: normal\n"...), 0o600))
	p.signal(t, syscall.SIGHUP)
	waitForT(t, 10*time.Second, "the reload", func() bool { return strings.Contains(p.out.String(), "configuration reloaded") })
	require.Equal(t, []int{0}, threadPolicies(t, pid), "SCHED_OTHER (0), every thread")
}

// threadPolicies is the scheduling policies of process pid's threads, each
// once, sorted: field 41 of /proc/PID/task/TID/stat.
func threadPolicies(t *testing.T, pid int) []int {
	t.Helper()
	stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	require.NoError(t, err)
	require.NotEmpty(t, stats)
	var policies []int
	for _, path := range stats {
		fields, err := osproc.StatFields(path)
		if err != nil {
			continue // the thread ended
		}
		require.Greater(t, len(fields), 41-3, path)
		policy, err := strconv.Atoi(fields[41-3])
		require.NoError(t, err)
		if !slices.Contains(policies, policy) {
			policies = append(policies, policy)
		}
	}
	slices.Sort(policies)
	return policies
}
