package main

import (
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// Heap floor defaults.
const (
	// HeapFloorDefault is as far as the heap may grow before the garbage
	// collector runs while the relay allocates fast. Its live heap is
	// small, and at Go's default (GOGC=100) a catch-up collected each time
	// the heap doubled it, many times a second. With this floor a
	// catch-up's relay took 7% less CPU per event and peaked at 52–55 MB of
	// RSS (50–54 at the default); 32 MiB saved 11% and peaked at 62–63 MB,
	// too near the 64 MB it is held to (docs/benchmarks.md).
	HeapFloorDefault = 24 << 20
	// heapFloorPace is the time between collections the floor aims for:
	// the heap may grow by what the relay allocates in that time (up to
	// the floor) before the next. A relay that allocates slowly (200
	// events/s) collects at Go's default, so its heap and RSS stay small;
	// no CPU was saved there.
	heapFloorPace = 500 * time.Millisecond
	// heapFloorEvery is how often the floor looks for a finished
	// collection; the percentage it sets holds until the next.
	heapFloorEvery = 100 * time.Millisecond
	// heapFloorMaxPercent bounds the percentage it sets.
	heapFloorMaxPercent = 1000
)

// heapFloor spaces the garbage collector's runs while the relay allocates
// fast: after each collection it sets GOGC so that the next comes once the
// relay has allocated for heapFloorPace, with the heap at most at the
// floor, and never sooner than Go's default (twice the live heap). Unlike
// a memory limit (GOMEMLIMIT with GOGC=off), a live heap above the floor
// (large payloads in flight) never makes the collector run back to back:
// the goal grows with it. An operator who sets GOGC or GOMEMLIMIT decides
// alone; the floor then does nothing.
type heapFloor struct {
	floor uint64
	stop  chan struct{}
	done  chan struct{}
}

// startHeapFloor starts the floor's goroutine, or returns nil when GOGC or
// GOMEMLIMIT is set.
func startHeapFloor(floor uint64) *heapFloor {
	for _, v := range []string{"GOGC", "GOMEMLIMIT"} {
		if _, set := os.LookupEnv(v); set {
			return nil
		}
	}
	h := &heapFloor{floor: floor, stop: make(chan struct{}), done: make(chan struct{})}
	go h.run()
	return h
}

// Stop ends the goroutine and puts GOGC back to its default. It is a
// no-op on nil.
func (h *heapFloor) Stop() {
	if h == nil {
		return
	}
	close(h.stop)
	<-h.done
	debug.SetGCPercent(100)
}

func (h *heapFloor) run() {
	defer close(h.done)
	samples := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/gc/heap/live:bytes"}, {Name: "/gc/heap/allocs:bytes"}}
	var cycles, allocs uint64
	var since time.Time
	percent := 100
	tick := time.NewTicker(heapFloorEvery)
	defer tick.Stop()
	for {
		metrics.Read(samples)
		now := time.Now()
		if samples[0].Value.Kind() == metrics.KindUint64 {
			c, live, a := samples[0].Value.Uint64(), samples[1].Value.Uint64(), samples[2].Value.Uint64()
			if c != cycles {
				if !since.IsZero() {
					rate := float64(a-allocs) / now.Sub(since).Seconds()
					if p := floorPercent(h.floor, live, uint64(rate*heapFloorPace.Seconds())); p != percent {
						percent = p
						debug.SetGCPercent(p)
					}
				}
				cycles, allocs, since = c, a, now
			}
		}
		select {
		case <-h.stop:
			return
		case <-tick.C:
		}
	}
}

// floorPercent is the GOGC that lets the heap grow by paced bytes after a
// collection that left live bytes, up to floor bytes in all, and never
// less than Go's default of 100 (twice the live heap). It moves in steps
// of 10, so a live heap that varies a little does not reset it after every
// collection.
func floorPercent(floor, live, paced uint64) int {
	if live >= floor/2 {
		return 100
	}
	grow := min(paced, floor-live)
	if live == 0 {
		live = 1
	}
	p := int(min(grow*100/live, heapFloorMaxPercent))
	p -= p % 10
	return max(p, 100)
}
