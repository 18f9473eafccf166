package maintain

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/postbox-relay/postbox/internal/proc"
	"github.com/postbox-relay/postbox/relay/internal/service"
	"github.com/postbox-relay/postbox/relay/internal/wal"
)

// Walsender watch cadence.
const (
	// WalsenderFirstDefault is when the walsender is first read after
	// start; WalsenderIntervalDefault how often after that.
	WalsenderFirstDefault    = time.Second
	WalsenderIntervalDefault = 15 * time.Second
)

// Thresholds of walsenderWatch.
const (
	// walsenderStarvedReadings is how many readings in a row must find
	// the walsender starved before a warning: a minute at
	// WalsenderIntervalDefault, so that a burst does not warn.
	walsenderStarvedReadings = 4
	// walsenderWarnEvery is how often a warning is repeated while the
	// walsender stays starved.
	walsenderWarnEvery = time.Hour
)

// walsenderWatch reads, every interval, the CPU of the walsender streaming
// this instance's session where it runs on this machine, and warns when it
// was starved (wal.Starved) for a minute: the database's CPUs are
// saturated, and committed rows reach postbox late for it, which no
// setting of postbox's delivery changes. It says so once again when the
// walsender keeps up.
type walsenderWatch struct {
	periodic
	env *service.Env
	log zerolog.Logger
	cpu func() (pid int, c proc.CPU, ok bool)

	// The readings, the loop's alone.
	pid      int
	prev     proc.CPU
	prevAt   time.Time
	starved  int // readings in a row that found it starved
	warnedAt time.Time
	warned   bool // a warning stands, not yet followed by a recovery
}

func newWalsenderWatch(env *service.Env, cpu func() (int, proc.CPU, bool)) *walsenderWatch {
	w := &walsenderWatch{env: env, log: env.Logger("maintain"), cpu: cpu}
	w.first, w.interval = WalsenderFirstDefault, WalsenderIntervalDefault
	return w
}

// Start runs the watch.
func (w *walsenderWatch) Start(ctx context.Context) error {
	return w.start(ctx, func(context.Context) {
		pid, c, ok := w.cpu()
		w.observe(w.log, pid, c, ok, w.env.Config().CPUBatch, time.Now())
	})
}

// walsenderVerdict is what one reading calls for.
type walsenderVerdict int

const (
	walsenderQuiet walsenderVerdict = iota
	walsenderWarn
	walsenderRecovered
)

// read takes a reading made at now (ok false: there is no walsender here
// to read) and says what it calls for, with the span it judged and what
// the walsender ran and waited in it.
func (w *walsenderWatch) read(pid int, c proc.CPU, ok bool, now time.Time) (v walsenderVerdict, over, ran, waited time.Duration) {
	if !ok {
		w.pid, w.starved = 0, 0
		return walsenderQuiet, 0, 0, 0
	}
	if pid != w.pid || c.Ran < w.prev.Ran {
		// A new session's walsender, or the first reading: nothing to
		// compare with yet.
		w.pid, w.prev, w.prevAt, w.starved = pid, c, now, 0
		return walsenderQuiet, 0, 0, 0
	}
	over, ran, waited = now.Sub(w.prevAt), c.Ran-w.prev.Ran, c.Waited-w.prev.Waited
	w.prev, w.prevAt = c, now
	if !wal.Starved(ran, waited, over) {
		w.starved = 0
		if w.warned {
			w.warned = false
			return walsenderRecovered, over, ran, waited
		}
		return walsenderQuiet, over, ran, waited
	}
	w.starved++
	if w.starved >= walsenderStarvedReadings && (!w.warned || now.Sub(w.warnedAt) >= walsenderWarnEvery) {
		w.warned, w.warnedAt = true, now
		return walsenderWarn, over, ran, waited
	}
	return walsenderQuiet, over, ran, waited
}

// observe reads and logs what the reading calls for.
func (w *walsenderWatch) observe(log zerolog.Logger, pid int, c proc.CPU, ok, batch bool, now time.Time) {
	v, over, ran, waited := w.read(pid, c, ok, now)
	switch v {
	case walsenderWarn:
		log.Warn().Int("pid", pid).Int("nice", c.Nice).Dur("over", over).Dur("ran", ran).Dur("waited", waited).Str("fix", wal.StarvedFix(c.Nice, batch)).
			Msg("WALSENDER STARVED: for a minute the walsender streaming postbox's slot waited for a CPU as long as it ran; " +
				"the database's CPUs are saturated, and committed rows reach postbox late")
	case walsenderRecovered:
		log.Info().Int("pid", pid).Int("nice", c.Nice).Dur("over", over).Dur("ran", ran).Dur("waited", waited).
			Msg("the walsender keeps up again")
	}
}
