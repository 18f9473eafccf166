package portal

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/postbox-relay/postbox/relay/report"
)

// CSVTimeout bounds a day's CSV (under the admin listener's write timeout).
const CSVTimeout = 25 * time.Second

// ReportDaysMax bounds the report page's period.
const ReportDaysMax = 92

type reportPage struct {
	From, To, TZ string
	Days         []report.Day
	Totals       report.Day
	SumKeys      []string
	Error        string
}

// reportRange reads the report's period and time zone: from and to are
// days (YYYY-MM-DD) in tz, to included; the last 30 days by default.
func (p *Portal) reportRange(rq *request) (from, to time.Time, tz *time.Location, pg reportPage, err error) {
	q := rq.r.URL.Query()
	pg = reportPage{From: strings.TrimSpace(q.Get("from")), To: strings.TrimSpace(q.Get("to")), TZ: strings.TrimSpace(q.Get("tz"))}
	if pg.TZ == "" {
		pg.TZ = rq.claims.TZ
	}
	if pg.TZ == "" {
		pg.TZ = "UTC"
	}
	if tz, err = time.LoadLocation(pg.TZ); err != nil || len(pg.TZ) > 64 {
		return from, to, nil, pg, fmt.Errorf("unknown time zone %q: use a name such as UTC or Europe/Malta", pg.TZ)
	}
	today := time.Date(p.now().In(tz).Year(), p.now().In(tz).Month(), p.now().In(tz).Day(), 0, 0, 0, 0, tz)
	if pg.To == "" {
		pg.To = today.Format(time.DateOnly)
	}
	if pg.From == "" {
		pg.From = today.AddDate(0, 0, -29).Format(time.DateOnly)
	}
	if from, err = time.ParseInLocation(time.DateOnly, pg.From, tz); err != nil {
		return from, to, tz, pg, fmt.Errorf("from: want a day such as 2026-01-02")
	}
	last, err := time.ParseInLocation(time.DateOnly, pg.To, tz)
	if err != nil {
		return from, to, tz, pg, fmt.Errorf("to: want a day such as 2026-01-31")
	}
	to = last.AddDate(0, 0, 1)
	if !from.Before(to) {
		return from, to, tz, pg, fmt.Errorf("from is after to")
	}
	if to.Sub(from) > ReportDaysMax*24*time.Hour+time.Hour {
		return from, to, tz, pg, fmt.Errorf("at most %d days at once", ReportDaysMax)
	}
	return from, to, tz, pg, nil
}

// report is the partner's daily counts per event type: what both sides
// reconcile, from postbox's own rows.
func (p *Portal) report(rq *request) error {
	from, to, tz, pg, err := p.reportRange(rq)
	if err != nil {
		pg.Error = err.Error()
		p.render(rq.w, rq, http.StatusBadRequest, "report", "Report", "report", pg)
		return nil
	}
	if pg.Days, err = report.Daily(rq.ctx, rq.pool, rq.endpoint, from, to, tz); err != nil {
		return err
	}
	keys := map[string]bool{}
	pg.Totals.Sums = map[string]float64{}
	for _, d := range pg.Days {
		pg.Totals.Committed += d.Committed
		pg.Totals.Delivered += d.Delivered
		pg.Totals.DeadLettered += d.DeadLettered
		pg.Totals.Pending += d.Pending
		for k, v := range d.Sums {
			pg.Totals.Sums[k] += v
			if !keys[k] {
				keys[k] = true
				pg.SumKeys = append(pg.SumKeys, k)
			}
		}
	}
	p.render(rq.w, rq, http.StatusOK, "report", "Report", "report", pg)
	return nil
}

// dayCSV streams one day's deliveries as CSV; exports are rate-limited
// per link.
func (p *Portal) dayCSV(rq *request) error {
	q := rq.r.URL.Query()
	tzName := strings.TrimSpace(q.Get("tz"))
	if tzName == "" {
		tzName = rq.claims.TZ
	}
	if tzName == "" {
		tzName = "UTC"
	}
	tz, err := time.LoadLocation(tzName)
	if err != nil || len(tzName) > 64 {
		return &httpError{http.StatusBadRequest, "Bad request", "Unknown time zone: use a name such as UTC or Europe/Malta."}
	}
	day := q.Get("day")
	if _, err := time.ParseInLocation(time.DateOnly, day, tz); err != nil {
		return &httpError{http.StatusBadRequest, "Bad request", "A day is YYYY-MM-DD."}
	}
	if !p.limits.allow("csv|"+rq.claims.LinkID, ExportsPerMinute) {
		return &httpError{http.StatusTooManyRequests, "Too many exports", fmt.Sprintf("At most %d exports a minute: wait a moment.", ExportsPerMinute)}
	}
	// A day's CSV may take longer than a page: its own bound.
	ctx, cancel := context.WithTimeout(rq.r.Context(), CSVTimeout)
	defer cancel()
	h := rq.w.Header()
	h.Set("Content-Type", "text/csv; charset=utf-8")
	h.Set("Content-Disposition", fmt.Sprintf(`attachment; filename="deliveries-%s.csv"`, day))
	rq.w.WriteHeader(http.StatusOK)
	if err := report.WriteDayCSV(ctx, rq.pool, rq.w, rq.endpoint, day, tz); err != nil {
		// The header is out: the file ends short, and the log says why.
		p.log.Error().Err(err).Str("endpoint", rq.endpoint).Msg("portal CSV export failed")
	}
	p.log.Info().Str("endpoint", rq.endpoint).Str("link", rq.claims.LinkID).Str("day", day).Msg("portal CSV export")
	return nil
}
