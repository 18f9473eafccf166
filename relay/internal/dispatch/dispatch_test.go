package dispatch_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/internal/dispatch"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/postboxtype"
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
	h.d = connected(dispatch.Options{
		Capacity: func(ep string) int { return caps[ep] },
		Execute:  hExecute(h),
	}, func(o dispatch.Outcome) {
		h.mu.Lock()
		h.outcomes = append(h.outcomes, o)
		h.mu.Unlock()
		h.d.Recorded(o.Job)
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
			return state.Result{DeliveryID: j.DeliveryID, Status: postboxtype.DeliveryDelivered}
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

func (h *harness) count(status postboxtype.DeliveryState) int {
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
		h.d.Submit(&dispatch.Job{DeliveryID: int64(i), Event: state.Event{Endpoint: "slow"}}, false)
		h.d.Submit(&dispatch.Job{DeliveryID: int64(100 + i), Event: state.Event{Endpoint: "fast"}}, false)
	}
	require.Eventually(t, func() bool { return h.running["slow"].Load() == 2 && h.running["fast"].Load() == 3 },
		5*time.Second, time.Millisecond)
	free, _ := h.d.Room()
	require.Equal(t, 0, free["slow"], "2 running + 8 queued is the lane's limit (5 × cap)")
	close(h.release)
	require.Eventually(t, func() bool { return h.count(postboxtype.DeliveryDelivered) == 20 }, 5*time.Second, time.Millisecond)
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
}

func TestStopReleasesQueuedAndCancelsPastGrace(t *testing.T) {
	t.Parallel()
	h := newHarness(map[string]int{"e": 1})
	for i := range 3 {
		h.d.Submit(&dispatch.Job{DeliveryID: int64(i), Event: state.Event{Endpoint: "e"}}, false)
	}
	require.Eventually(t, func() bool { return h.running["e"].Load() == 1 }, 5*time.Second, time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	h.d.Stop(ctx)
	require.Equal(t, 3, h.count(state.Released), "two queued and the one cut off")
	require.False(t, h.d.Reserve("e"), "no fast path while stopping")
	h.d.Submit(&dispatch.Job{DeliveryID: 9, Event: state.Event{Endpoint: "e"}}, false)
	require.Equal(t, 4, h.count(state.Released), "a job submitted while stopping is released")
}

func TestGlobalConcurrencyCapServesLanesInTurn(t *testing.T) {
	t.Parallel()
	caps := map[string]int{}
	for i := range 20 {
		caps[string(rune('a'+i))] = 4
	}
	h := newHarness(caps)
	h.d = connected(dispatch.Options{
		Capacity:       func(ep string) int { return caps[ep] },
		MaxConcurrency: 10,
		Execute:        hExecute(h),
	}, func(o dispatch.Outcome) {
		h.mu.Lock()
		h.outcomes = append(h.outcomes, o)
		h.mu.Unlock()
		h.d.Recorded(o.Job)
	})
	for ep := range caps {
		for i := range 3 {
			h.d.Submit(&dispatch.Job{DeliveryID: int64(i), Event: state.Event{Endpoint: ep}}, false)
		}
	}
	// Submit starts what the caps allow at once: ten attempts, all waiting.
	require.Equal(t, 10, h.d.InFlight())
	require.Eventually(t, func() bool { return h.total.Load() == 10 }, 5*time.Second, time.Millisecond)
	close(h.release)
	require.Eventually(t, func() bool { return h.count(postboxtype.DeliveryDelivered) == 60 }, 5*time.Second, time.Millisecond)
	require.EqualValues(t, 10, h.totalPeak.Load(), "never more than the global cap running at once, from the first job to the last")
}

// TestDrainingLanesTakeMoreFromTheFastPath: a lane that delivered within
// DrainWindow may be given up to DrainingLaneLimit jobs by the fast path
// (a catch-up's events are then written in flight once, not queued and
// claimed); a lane that has delivered nothing (hanging) stays at
// LaneLimit, and so does every lane once half the dispatcher's budget is
// held.
func TestDrainingLanesTakeMoreFromTheFastPath(t *testing.T) {
	t.Parallel()
	h := newHarness(map[string]int{"e": 2, "hang": 2})
	close(h.release)
	require.True(t, h.d.Reserve("e")) // the lane stays while it holds something
	h.d.Submit(&dispatch.Job{DeliveryID: 1, Event: state.Event{Endpoint: "e"}}, false)
	require.Eventually(t, func() bool { return h.count(postboxtype.DeliveryDelivered) == 1 }, 5*time.Second, time.Millisecond)
	for range dispatch.DrainingLaneLimit(2) - 1 {
		require.True(t, h.d.Reserve("e"))
	}
	require.False(t, h.d.Reserve("e"))
	for range dispatch.LaneLimit(2) {
		require.True(t, h.d.Reserve("hang"))
	}
	require.False(t, h.d.Reserve("hang"), "a lane that delivered nothing gets no more than its limit")

	small := connected(dispatch.Options{
		Capacity: func(string) int { return 2 },
		Execute: func(context.Context, *dispatch.Job) state.Result {
			return state.Result{Status: postboxtype.DeliveryDelivered}
		},
		MaxHeldJobs: 2 * dispatch.LaneLimit(2),
	}, func(dispatch.Outcome) {})
	require.True(t, small.Reserve("e"))
	small.Submit(&dispatch.Job{DeliveryID: 1, Event: state.Event{Endpoint: "e"}}, false) // delivered, never recorded: held
	require.Eventually(t, func() bool { free, _ := small.Room(); return free["e"] == dispatch.LaneLimit(2)-1 }, 5*time.Second, time.Millisecond)
	n := 0
	for small.Reserve("e") {
		n++
	}
	// Drained, the lane could take 18 more before the budget is full; at
	// half the budget it is back to its limit (1 reserved + 9).
	require.Equal(t, dispatch.LaneLimit(2)-1, n, "at half the budget, the draining lane is back to its limit")
}

// TestKeptDeliveriesWaitByIDForRoom: a draining lane whose fast path is
// full keeps deliveries by id, up to MaxKept, and hands them over as far
// as the lane has room (all of them when asked to); kept ids count as held
// for the sweep's rescue, and a lane that delivers nothing keeps none.
// Read back, they may fill a lane to KeptLaneLimit.
func TestKeptDeliveriesWaitByIDForRoom(t *testing.T) {
	t.Parallel()
	h := newHarness(map[string]int{"e": 2, "hang": 2})
	h.d = connected(dispatch.Options{
		Capacity: func(string) int { return 2 },
		Execute:  hExecute(h),
		MaxKept:  5,
	}, func(o dispatch.Outcome) { h.d.Recorded(o.Job) })
	require.False(t, h.d.ReserveKeep("e"), "a lane that has not delivered keeps nothing")
	require.True(t, h.d.Reserve("e")) // the lane stays while it holds something
	h.d.Submit(&dispatch.Job{DeliveryID: 1, Event: state.Event{Endpoint: "e"}}, false)
	h.release <- struct{}{}
	require.Eventually(t, func() bool { return h.d.InFlight() == 0 }, 5*time.Second, time.Millisecond)

	for range 5 {
		require.True(t, h.d.ReserveKeep("e"))
	}
	require.False(t, h.d.ReserveKeep("e"), "MaxKept, reservations included")
	require.Equal(t, 5, h.d.KeptCount())
	for id := int64(10); id < 14; id++ {
		h.d.Keep("e", dispatch.Kept{ID: id})
	}
	h.d.Keep("e", dispatch.Kept{ID: 0}) // its event had been ingested before
	require.Equal(t, 4, h.d.KeptCount())
	require.Equal(t, []string{"e"}, h.d.LanesWithKept())
	require.Equal(t, []int64{99}, h.d.DeliveriesNotHeld([]int64{10, 13, 99}), "kept ids are held")

	// The lane holds KeptLaneLimit jobs: no room, nothing handed over.
	for i := range dispatch.KeptLaneLimit(2) {
		h.d.Submit(&dispatch.Job{DeliveryID: int64(100 + i), Event: state.Event{Endpoint: "e"}}, false)
	}
	require.Empty(t, h.d.HandOverKept(nil))
	require.Equal(t, map[string][]dispatch.Kept{"e": {{ID: 10}, {ID: 11}, {ID: 12}, {ID: 13}}}, h.d.HandOverKept(map[string]bool{"e": true}), "all, oldest first, when asked")
	require.Zero(t, h.d.KeptCount())
	require.Equal(t, []int64{10}, h.d.DeliveriesNotHeld([]int64{10}), "handed over: no longer held until submitted")
	close(h.release)
	require.Eventually(t, func() bool { return h.d.InFlight() == 0 }, 5*time.Second, time.Millisecond)

	require.True(t, h.d.ReserveKeep("e"))
	require.True(t, h.d.ReserveKeep("e"))
	h.d.Keep("e", dispatch.Kept{ID: 20})
	h.d.Keep("e", dispatch.Kept{ID: 21})
	require.Equal(t, map[string][]dispatch.Kept{"e": {{ID: 20}, {ID: 21}}}, h.d.HandOverKept(nil), "as far as the lane has room")
}

// TestRangesOfEventsUnderWayAreDoneWhenNoEventIsHeld: the dispatcher
// counts the events of each range under way it holds, kept, let go by the
// claimer, submitted and recorded; a range is handed over as done once,
// when its last event goes, and never while one is held.
func TestRangesOfEventsUnderWayAreDoneWhenNoEventIsHeld(t *testing.T) {
	t.Parallel()
	h := newHarness(map[string]int{"e": 2})
	h.d = connected(dispatch.Options{
		Capacity: func(string) int { return 2 },
		Execute:  hExecute(h),
		MaxKept:  10,
	}, func(o dispatch.Outcome) { h.d.Recorded(o.Job) })
	require.True(t, h.d.Reserve("e"))
	h.d.Submit(&dispatch.Job{DeliveryID: 1, Event: state.Event{Endpoint: "e"}}, false)
	h.release <- struct{}{}
	require.Eventually(t, func() bool { return h.d.InFlight() == 0 }, 5*time.Second, time.Millisecond)

	for range 4 {
		require.True(t, h.d.ReserveKeep("e"))
	}
	h.d.Keep("e", dispatch.Kept{ID: 10, Range: 7})
	h.d.Keep("e", dispatch.Kept{ID: 11, Range: 7})
	h.d.Keep("e", dispatch.Kept{ID: 12, Range: 8})
	h.d.Keep("e", dispatch.Kept{}) // not committed: counted nowhere
	require.Equal(t, []int64{9}, h.d.RangesNotHeld([]int64{7, 8, 9}))
	require.Equal(t, []int64{10}, h.d.DeliveriesNotHeld([]int64{10}), "an event's id is not a delivery's")

	kept := h.d.HandOverKept(map[string]bool{"e": true})["e"]
	require.Len(t, kept, 3)
	h.d.ForgetUnderWay([]int64{8}) // queued back
	require.Equal(t, []int64{8}, h.d.TakeFinishedRanges())
	require.Empty(t, h.d.TakeFinishedRanges(), "handed over once")
	h.d.ForgetUnderWay([]int64{8}) // a range no longer counted is no one's
	require.Empty(t, h.d.TakeFinishedRanges())

	h.d.Submit(&dispatch.Job{EventPK: 10, Range: 7, Event: state.Event{Endpoint: "e"}}, false)
	h.d.ForgetUnderWay([]int64{7}) // event 11: written before it was read
	require.Empty(t, h.d.TakeFinishedRanges(), "event 10 is in flight")
	require.Empty(t, h.d.RangesNotHeld([]int64{7}))
	close(h.release)
	require.Eventually(t, func() bool { return h.d.InFlight() == 0 }, 5*time.Second, time.Millisecond)
	require.Equal(t, []int64{7}, h.d.TakeFinishedRanges(), "recorded: the range is done")
	require.Equal(t, []int64{7}, h.d.RangesNotHeld([]int64{7}))
}

// Attempts made before their ingest committed cannot be recorded until it
// has, and a crash meanwhile repeats them: a lane whose partner answers at
// once makes at most AheadLimit(cap) + cap - 1 of them, then waits for the
// ingest.
func TestAttemptsAheadOfTheIngestWaitForIt(t *testing.T) {
	t.Parallel()
	const capacity = 2
	h := newHarness(map[string]int{"e": capacity})
	close(h.release) // the partner answers at once
	tx := newTestIngest(nil)
	for i := range 20 {
		h.d.Submit(&dispatch.Job{DeliveryID: int64(i + 1), Event: state.Event{Endpoint: "e"}, Ingest: tx}, false)
	}
	ahead := dispatch.AheadLimit(capacity) + capacity - 1
	require.Less(t, ahead, 20)
	require.Eventually(t, func() bool { return h.count(postboxtype.DeliveryDelivered) == ahead }, 5*time.Second, time.Millisecond)
	require.Never(t, func() bool { return h.count(postboxtype.DeliveryDelivered) > ahead }, 100*time.Millisecond, time.Millisecond,
		"no more attempts before the ingest commits")
	free, _ := h.d.Room()
	require.Zero(t, free["e"], "the attempts waiting for the ingest hold their room")
	tx.Finish(nil)
	require.Eventually(t, func() bool { return h.count(postboxtype.DeliveryDelivered) == 20 }, 5*time.Second, time.Millisecond)
}

// An attempt ahead of its ingest starts only while that may still
// commit: once the instance may have lost its lead (paused past its
// lease), it waits for the ingest, and it is not made at all for a
// delivery the ingest did not write (failed, or found ingested before).
func TestAttemptsAheadOfAnUncertainIngestWaitForItsOutcome(t *testing.T) {
	t.Parallel()
	h := newHarness(map[string]int{"e": 4})
	close(h.release)
	var live atomic.Bool
	committed, failed := newTestIngest(live.Load), newTestIngest(live.Load)
	a, b := &dispatch.Job{Event: state.Event{Endpoint: "e"}, Ingest: committed}, &dispatch.Job{Event: state.Event{Endpoint: "e"}, Ingest: committed}
	c := &dispatch.Job{Event: state.Event{Endpoint: "e"}, Ingest: failed}
	for _, j := range []*dispatch.Job{a, b, c} {
		h.d.Submit(j, false)
	}
	require.Never(t, func() bool { return h.totalPeak.Load() > 0 }, 100*time.Millisecond, time.Millisecond,
		"no attempt while the ingests may not commit")

	h.d.Assign(a, 11) // written; b's event had been ingested before
	committed.Finish(nil)
	failed.Finish(errors.New("fenced: another instance leads"))
	require.Eventually(t, func() bool {
		return h.d.InFlight() == 0 && h.count(postboxtype.DeliveryDelivered)+h.count(state.Released) == 3
	},
		5*time.Second, time.Millisecond)
	require.Equal(t, 1, h.count(postboxtype.DeliveryDelivered), "only the delivery the ingest wrote is attempted")
	require.Equal(t, 2, h.count(state.Released))
	require.EqualValues(t, 1, h.totalPeak.Load())

	// While the lead is certain, attempts start before the commit.
	live.Store(true)
	d := &dispatch.Job{Event: state.Event{Endpoint: "e"}, Ingest: newTestIngest(live.Load)}
	h.d.Submit(d, false)
	require.Eventually(t, func() bool { return h.count(postboxtype.DeliveryDelivered) == 2 }, 5*time.Second, time.Millisecond)
}

// TestKeptRetriesAreHandedOverWhenDue: kept retries are held by id until
// due, then handed over in due order as far as their lanes have room;
// those of lanes that take no work, or that are full, go back to the
// queue, and with all every one does, due or not.
func TestKeptRetriesAreHandedOverWhenDue(t *testing.T) {
	t.Parallel()
	h := newHarness(map[string]int{"e": 1, "f": 1})
	h.d = connected(dispatch.Options{
		Capacity: func(string) int { return 1 },
		Execute:  hExecute(h),
		MaxKept:  4,
	}, func(o dispatch.Outcome) { h.d.Recorded(o.Job) })
	t0 := time.Now()
	h.d.KeepRetry("e", 3, t0.Add(3*time.Second))
	h.d.KeepRetry("e", 1, t0.Add(time.Second))
	h.d.KeepRetry("f", 2, t0.Add(2*time.Second))
	h.d.KeepRetry("f", 2, t0.Add(2*time.Second)) // kept once
	require.Equal(t, 3, h.d.KeptRetries())
	require.True(t, h.d.CanKeepRetry())
	h.d.KeepRetry("g", 4, t0.Add(time.Hour))
	require.False(t, h.d.CanKeepRetry(), "MaxKept")
	next, ok := h.d.NextRetryDue()
	require.True(t, ok)
	require.Equal(t, t0.Add(time.Second), next)
	require.Equal(t, []int64{99}, h.d.DeliveriesNotHeld([]int64{1, 2, 3, 99}), "kept retries are held")

	yes := func(string) bool { return true }
	load, back := h.d.HandOverDueRetries(t0, false, yes)
	require.Empty(t, load, "none due")
	require.Empty(t, back)
	load, back = h.d.HandOverDueRetries(t0.Add(2*time.Second), false, func(lane string) bool { return lane != "f" })
	require.Equal(t, map[string][]int64{"e": {1}}, load, "due, its lane taking work")
	require.Equal(t, []int64{2}, back, "due, its lane taking none")
	require.Equal(t, []int64{2}, h.d.DeliveriesNotHeld([]int64{2, 3}), "handed over, no longer held")

	// e's lane is full (LaneLimit of 1 held): its retry goes back.
	require.True(t, h.d.Reserve("e"))
	for i := range dispatch.LaneLimit(1) - 1 {
		h.d.Submit(&dispatch.Job{DeliveryID: int64(100 + i), Event: state.Event{Endpoint: "e"}}, false)
	}
	load, back = h.d.HandOverDueRetries(t0.Add(3*time.Second), false, yes)
	require.Empty(t, load)
	require.Equal(t, []int64{3}, back, "its lane is full")

	load, back = h.d.HandOverDueRetries(t0, true, yes)
	require.Empty(t, load)
	require.Equal(t, []int64{4}, back, "all of them, due or not")
	_, ok = h.d.NextRetryDue()
	require.False(t, ok)
	close(h.release)
}
