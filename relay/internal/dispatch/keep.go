package dispatch

import (
	"slices"
	"time"
)

// ReserveKeep promises room for one delivery of lane to be kept by id:
// for the ingest, when Reserve refused it a slot. A lane that drains
// (delivered within DrainWindow) is then better served by its delivery
// written in flight for this instance, its id kept in memory and its
// event read back by id once the lane has room (HandOverKept), than by the
// queue: that costs the claim's second write of the row and its indexes.
// The ingest keeps deliveries only while no other instance could claim
// them instead. It reports false when the lane does not drain, the
// dispatcher keeps MaxKept already, or it is stopping.
func (d *Dispatcher) ReserveKeep(lane string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopping || d.kept >= d.opts.MaxKept {
		return false
	}
	l := d.laneLocked(lane)
	if time.Since(l.lastOK) >= DrainWindow {
		d.dropIdleLocked(lane, l)
		return false
	}
	l.keepReserved++
	d.kept++
	return true
}

// Keep turns a reservation of ReserveKeep into a kept delivery or event
// under way, once the transaction that wrote it has committed; with id 0
// it gives the reservation back.
func (d *Dispatcher) Keep(lane string, k Kept) {
	id := k.ID
	d.mu.Lock()
	defer d.mu.Unlock()
	l := d.lanes[lane]
	if l == nil || l.keepReserved == 0 {
		return
	}
	l.keepReserved--
	if id == 0 || d.stopping {
		d.kept--
		d.dropIdleLocked(lane, l)
		return
	}
	l.kept = append(l.kept, k)
	if k.Range != 0 {
		d.underWay[k.Range]++
	}
}

// Kept is a delivery kept by id, or with Range, an event under way kept
// by its id (no delivery is written yet).
type Kept struct {
	ID, Range int64
}

// KeptCount is how many deliveries are kept by id, reservations included.
func (d *Dispatcher) KeptCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.kept
}

// LanesWithKept returns the lanes that have kept deliveries.
func (d *Dispatcher) LanesWithKept() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for name, l := range d.lanes {
		if len(l.kept) > 0 {
			out = append(out, name)
		}
	}
	return out
}

// HandOverKept hands over, per lane, the kept deliveries that fit the room
// the lane has, oldest first, and for the lanes in all every kept
// delivery regardless of room. The caller submits them (or returns them
// to the queue).
func (d *Dispatcher) HandOverKept(all map[string]bool) map[string][]Kept {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.kept == 0 {
		return nil
	}
	out := map[string][]Kept{}
	for name, l := range d.lanes {
		n := len(l.kept)
		if !all[name] {
			n = min(n, l.keptLimit()-l.held())
		}
		if n <= 0 {
			continue
		}
		out[name] = slices.Clone(l.kept[:n])
		l.kept = append(l.kept[:0], l.kept[n:]...)
		d.kept -= n
		d.dropIdleLocked(name, l)
	}
	return out
}

// ForgetUnderWay tells the dispatcher that the caller no longer holds these events
// under way, one range per event: returned to the queue, or found written
// or swept when loaded (see Kept).
func (d *Dispatcher) ForgetUnderWay(ranges []int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range ranges {
		d.forgetUnderWayLocked(r)
	}
}

func (d *Dispatcher) forgetUnderWayLocked(r int64) {
	switch n := d.underWay[r]; {
	case n > 1:
		d.underWay[r] = n - 1
	case n == 1:
		delete(d.underWay, r)
		d.done = append(d.done, r)
	}
}

// TakeFinishedRanges hands over the ranges of events under way that no longer hold
// any event of this instance's: the claimer sweeps them.
func (d *Dispatcher) TakeFinishedRanges() []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := d.done
	d.done = nil
	return out
}

// RangesNotHeld returns those of ranges of which the dispatcher holds no
// event.
func (d *Dispatcher) RangesNotHeld(ranges []int64) []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []int64
	for _, r := range ranges {
		if d.underWay[r] == 0 {
			out = append(out, r)
		}
	}
	return out
}

// Assign gives a job submitted before its delivery was inserted the id
// the insert returned (0: its event had been ingested before, so the
// delivery is another's and this job's outcome is dropped). The ingester
// calls it before it finishes the job's Ingest.
func (d *Dispatcher) Assign(j *Job, id int64) {
	j.assigned.Store(id)
	if id != 0 {
		d.mu.Lock()
		d.heldIDs[id]++
		d.mu.Unlock()
	}
}

// AssignUnderWay gives a job submitted before its insert the event and
// range of its event, written under way (store.Ingested): the recorder
// writes its delivery with the attempt's outcome. The ingester calls it
// before it finishes the job's Ingest.
func (d *Dispatcher) AssignUnderWay(j *Job, eventPK, rangeID int64) {
	j.assignedEvent.Store(eventPK)
	j.assignedRange.Store(rangeID)
	d.mu.Lock()
	d.underWay[rangeID]++
	d.mu.Unlock()
}

// DeliveriesNotHeld returns those of ids the dispatcher does not hold: not submitted
// (nor kept, see ReserveKeep and KeepRetry), or recorded already.
func (d *Dispatcher) DeliveriesNotHeld(ids []int64) []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var kept map[int64]bool
	if d.kept > 0 {
		kept = make(map[int64]bool, len(ids))
		for _, id := range ids {
			kept[id] = false
		}
		for _, l := range d.lanes {
			for _, k := range l.kept {
				if _, ok := kept[k.ID]; ok && k.Range == 0 {
					kept[k.ID] = true
				}
			}
		}
	}
	var out []int64
	for _, id := range ids {
		if d.heldIDs[id] == 0 && !kept[id] && !d.retryIDs[id] {
			out = append(out, id)
		}
	}
	return out
}
