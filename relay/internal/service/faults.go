package service

import (
	"sort"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/postbox-relay/postbox/relay/internal/store"
)

// FaultFreshDefault is how long a fault counts after its last report when
// no success of the same part clears it (a recorder with nothing left to
// write reports nothing).
const FaultFreshDefault = time.Minute

// Fault is a database fault a part of the relay ran into.
type Fault struct {
	// Cause says what is wrong, in a sentence an operator can act on.
	Cause string `json:"cause"`
	// Component is the part that ran into it; Error the last error.
	Component string    `json:"component"`
	Error     string    `json:"error"`
	Since     time.Time `json:"since"`
	last      time.Time
}

// Faults tracks the database faults the relay's parts run into: each part
// reports its errors and its successes, the first report of a cause logs
// one line naming it, and readiness and the status show what is current.
type Faults struct {
	mu     sync.Mutex
	log    zerolog.Logger
	now    func() time.Time
	byPart map[string]*Fault
}

// NewFaults returns a tracker that logs to log.
func NewFaults(log zerolog.Logger, now func() time.Time) *Faults {
	if now == nil {
		now = time.Now
	}
	return &Faults{log: log, now: now, byPart: map[string]*Fault{}}
}

// Observe records the outcome of a database operation of component: a nil
// err clears its fault, an error that names a database fault (see
// store.Cause) sets it. Other errors leave it as it is.
func (f *Faults) Observe(component string, err error) {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	if err == nil {
		if old, ok := f.byPart[component]; ok {
			delete(f.byPart, component)
			if !f.activeLocked(now) {
				f.log.Info().Str("cause", old.Cause).Dur("after", now.Sub(old.Since).Round(time.Millisecond)).
					Msg("database fault cleared; working normally again")
			}
		}
		return
	}
	cause := store.Cause(err)
	if cause == "" {
		return
	}
	if old, ok := f.byPart[component]; ok && old.Cause == cause {
		old.Error, old.last = err.Error(), now
		return
	}
	known := false
	for _, other := range f.byPart {
		if other.Cause == cause && now.Sub(other.last) < FaultFreshDefault {
			known = true
		}
	}
	f.byPart[component] = &Fault{Cause: cause, Component: component, Error: err.Error(), Since: now, last: now}
	if !known {
		f.log.Error().Str("component", component).Err(err).
			Msg("DATABASE FAULT: " + cause + "; postbox keeps running, backs off, and resumes by itself when this clears")
	}
}

func (f *Faults) activeLocked(now time.Time) bool {
	for _, x := range f.byPart {
		if now.Sub(x.last) < FaultFreshDefault {
			return true
		}
	}
	return false
}

// Current returns the faults reported within FaultFreshDefault and not
// cleared since, oldest first.
func (f *Faults) Current() []Fault {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	var out []Fault
	for _, x := range f.byPart {
		if now.Sub(x.last) < FaultFreshDefault {
			out = append(out, *x)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Since.Before(out[j].Since) })
	return out
}
