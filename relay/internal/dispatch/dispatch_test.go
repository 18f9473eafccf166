package dispatch_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/internal/dispatch"
	"github.com/postbox-relay/postbox/relay/internal/state"
)

type harness struct {
	d        *dispatch.Dispatcher
	mu       sync.Mutex
	outcomes []dispatch.Outcome
	running  map[string]*atomic.Int32
	peak     map[string]*atomic.Int32
	// Across all endpoints.
	total, totalPeak atomic.Int32
	release          chan struct{}
}

func newHarness(caps map[string]int) *harness {
	h := &harness{running: map[string]*atomic.Int32{}, peak: map[string]*atomic.Int32{}, release: make(chan struct{})}
	for ep := range caps {
		h.running[ep], h.peak[ep] = &atomic.Int32{}, &atomic.Int32{}
	}
	h.d = dispatch.New(dispatch.Options{
		Capacity: func(ep string) int { return caps[ep] },
		Execute:  hExecute(h),
		OnOutcome: func(o dispatch.Outcome) {
			h.mu.Lock()
			h.outcomes = append(h.outcomes, o)
			h.mu.Unlock()
			h.d.Recorded(o.Job)
		},
	})
	return h
}

func hExecute(h *harness) func(ctx context.Context, j *dispatch.Job) state.Result {
	return func(ctx context.Context, j *dispatch.Job) state.Result {
		raise(h.peak[j.Endpoint], h.running[j.Endpoint].Add(1))
		raise(&h.totalPeak, h.total.Add(1))
		defer h.running[j.Endpoint].Add(-1)
		defer h.total.Add(-1)
		select {
		case <-h.release:
			return state.Result{DeliveryID: j.DeliveryID, Status: state.Delivered}
		case <-ctx.Done():
			return dispatch.Released(j)
		}
	}
}

// raise makes peak at least n.
func raise(peak *atomic.Int32, n int32) {
	for {
		p := peak.Load()
		if n <= p || peak.CompareAndSwap(p, n) {
			return
		}
	}
}

func (h *harness) count(status state.Delivery) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, o := range h.outcomes {
		if o.Result.Status == status {
			n++
		}
	}
	return n
}

func TestLanesCapInFlightPerEndpoint(t *testing.T) {
	t.Parallel()
	h := newHarness(map[string]int{"slow": 2, "fast": 3})
	for i := range 10 {
		h.d.Submit(&dispatch.Job{DeliveryID: int64(i), Endpoint: "slow"}, false)
		h.d.Submit(&dispatch.Job{DeliveryID: int64(100 + i), Endpoint: "fast"}, false)
	}
	require.Eventually(t, func() bool { return h.running["slow"].Load() == 2 && h.running["fast"].Load() == 3 },
		5*time.Second, time.Millisecond)
	free, _ := h.d.Free()
	require.Equal(t, 0, free["slow"], "2 running + 8 queued is the lane's limit (5 × cap)")
	close(h.release)
	require.Eventually(t, func() bool { return h.count(state.Delivered) == 20 }, 5*time.Second, time.Millisecond)
	require.EqualValues(t, 2, h.peak["slow"].Load())
	require.EqualValues(t, 3, h.peak["fast"].Load())
}

func TestReserveStopsAtTheLaneLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(map[string]int{"e": 2})
	for range dispatch.LaneLimit(2) {
		require.True(t, h.d.Reserve("e"))
	}
	require.False(t, h.d.Reserve("e"), "lane full: the delivery waits in the queue table")
	h.d.Unreserve("e")
	require.True(t, h.d.Reserve("e"))
}

func TestStopReleasesQueuedAndCancelsPastGrace(t *testing.T) {
	t.Parallel()
	h := newHarness(map[string]int{"e": 1})
	for i := range 3 {
		h.d.Submit(&dispatch.Job{DeliveryID: int64(i), Endpoint: "e"}, false)
	}
	require.Eventually(t, func() bool { return h.running["e"].Load() == 1 }, 5*time.Second, time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	h.d.Stop(ctx)
	require.Equal(t, 3, h.count(state.Released), "two queued and the one cut off")
	require.False(t, h.d.Reserve("e"), "no fast path while stopping")
	h.d.Submit(&dispatch.Job{DeliveryID: 9, Endpoint: "e"}, false)
	require.Equal(t, 4, h.count(state.Released), "a job submitted while stopping is released")
}

func TestGlobalConcurrencyCapServesLanesInTurn(t *testing.T) {
	t.Parallel()
	caps := map[string]int{}
	for i := range 20 {
		caps[string(rune('a'+i))] = 4
	}
	h := newHarness(caps)
	h.d = dispatch.New(dispatch.Options{
		Capacity:       func(ep string) int { return caps[ep] },
		MaxConcurrency: 10,
		Execute:        hExecute(h),
		OnOutcome: func(o dispatch.Outcome) {
			h.mu.Lock()
			h.outcomes = append(h.outcomes, o)
			h.mu.Unlock()
			h.d.Recorded(o.Job)
		},
	})
	for ep := range caps {
		for i := range 3 {
			h.d.Submit(&dispatch.Job{DeliveryID: int64(i), Endpoint: ep}, false)
		}
	}
	// Submit starts what the caps allow at once: ten attempts, all waiting.
	require.Equal(t, 10, h.d.InFlight())
	require.Eventually(t, func() bool { return h.total.Load() == 10 }, 5*time.Second, time.Millisecond)
	close(h.release)
	require.Eventually(t, func() bool { return h.count(state.Delivered) == 60 }, 5*time.Second, time.Millisecond)
	require.EqualValues(t, 10, h.totalPeak.Load(), "never more than the global cap running at once, from the first job to the last")
}
