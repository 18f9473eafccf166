package main

import (
	"bufio"
	"context"
	"encoding/csv"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/postbox-relay/postbox/relay/report"
)

// cmdReport prints the daily reconciliation report: per day and event
// type, the events committed and what became of them, from the rollups
// (report_retention), or one day's deliveries as CSV (--deliveries DAY,
// from the events themselves, while event_retention keeps them).
func cmdReport(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("postbox report", flag.ContinueOnError)
	endpoint := fs.String("endpoint", "", "the endpoint reported on")
	all := fs.Bool("all", false, "every endpoint with events in the period")
	fromText := fs.String("from", "", "first day, YYYY-MM-DD in --tz (default: 6 days before --to)")
	toText := fs.String("to", "", "last day, YYYY-MM-DD in --tz, included (default: today)")
	tzName := fs.String("tz", "UTC", "the time zone whose days are reported (an IANA name: Europe/Paris)")
	csvOut := fs.Bool("csv", false, "print the report as CSV")
	deliveries := fs.String("deliveries", "", "DAY (YYYY-MM-DD in --tz): print that day's deliveries of --endpoint as CSV instead, one line per event")
	env, closeEnv, code := openOps(ctx, fs, args, stdout, stderr)
	if env == nil {
		return code
	}
	defer closeEnv()
	if len(env.args) > 0 {
		fmt.Fprintf(stderr, "postbox: report: unexpected %q\n", printable(env.args[0]))
		return exitUsage
	}
	tz, err := time.LoadLocation(*tzName)
	if err != nil {
		fmt.Fprintf(stderr, "postbox: --tz: %q is not a time zone (an IANA name such as Europe/Paris, or UTC)\n", printable(*tzName))
		return exitUsage
	}
	switch {
	case (*endpoint == "") == !*all:
		fmt.Fprintln(stderr, "postbox: report: give --endpoint NAME or --all")
		return exitUsage
	case *csvOut && env.json:
		fmt.Fprintln(stderr, "postbox: report: --csv or --json, not both")
		return exitUsage
	case *deliveries != "" && (*all || env.json || *fromText != "" || *toText != ""):
		fmt.Fprintln(stderr, "postbox: report: --deliveries DAY is one endpoint's day, as CSV: with --endpoint and --tz only")
		return exitUsage
	}
	if *deliveries != "" {
		w := bufio.NewWriterSize(stdout, 64<<10)
		if err := report.WriteDayCSV(ctx, env.pool, w, *endpoint, *deliveries, tz); err != nil {
			fmt.Fprintln(stderr, "postbox:", err)
			return exitFailure
		}
		if err := w.Flush(); err != nil {
			fmt.Fprintln(stderr, "postbox:", err)
			return exitFailure
		}
		return exitOK
	}
	now := time.Now().In(tz)
	to, err := parseDay(*toText, now, tz)
	if err != nil {
		fmt.Fprintln(stderr, "postbox: --to:", err)
		return exitUsage
	}
	from, err := parseDay(*fromText, to.AddDate(0, 0, -6), tz)
	if err != nil {
		fmt.Fprintln(stderr, "postbox: --from:", err)
		return exitUsage
	}
	if to.Before(from) {
		fmt.Fprintln(stderr, "postbox: report: --to is before --from")
		return exitUsage
	}
	end := to.AddDate(0, 0, 1) // --to is included
	var rows []report.EndpointDay
	if *all {
		rows, err = report.DailyAll(ctx, env.pool, from, end, tz)
	} else {
		var days []report.Day
		days, err = report.Daily(ctx, env.pool, *endpoint, from, end, tz)
		for _, d := range days {
			rows = append(rows, report.EndpointDay{Endpoint: *endpoint, Day: d})
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitFailure
	}
	if env.json {
		if rows == nil {
			rows = []report.EndpointDay{}
		}
		env.printJSON(struct {
			From string               `json:"from"`
			To   string               `json:"to"`
			TZ   string               `json:"tz"`
			Days []report.EndpointDay `json:"days"`
		}{from.Format(time.DateOnly), to.Format(time.DateOnly), tz.String(), rows})
		return exitOK
	}
	sums := sumFields(rows)
	if *csvOut {
		cw := csv.NewWriter(stdout)
		_ = cw.Write(append([]string{"day", "endpoint", "event_type", "committed", "delivered", "dead_lettered", "pending"}, prefixed("sum_", sums)...))
		for _, r := range rows {
			rec := []string{r.Day.Day, r.Endpoint, r.EventType, itoa(r.Committed), itoa(r.Delivered), itoa(r.DeadLettered), itoa(r.Pending)}
			for _, f := range sums {
				rec = append(rec, strconv.FormatFloat(r.Sums[f], 'f', -1, 64))
			}
			_ = cw.Write(rec)
		}
		cw.Flush()
		if err := cw.Error(); err != nil {
			fmt.Fprintln(stderr, "postbox:", err)
			return exitFailure
		}
		return exitOK
	}
	if len(rows) == 0 {
		fmt.Fprintf(stdout, "no events committed from %s to %s (%s)\n", from.Format(time.DateOnly), to.Format(time.DateOnly), tz)
		return exitOK
	}
	tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DAY\tENDPOINT\tEVENT TYPE\tCOMMITTED\tDELIVERED\tDEAD-LETTERED\tPENDING"+strings.Join(prefixed("\tSUM ", sums), ""))
	var total report.Day
	total.Sums = map[string]float64{}
	for _, r := range rows {
		line := fmt.Sprintf("%s\t%s\t%s\t%d\t%d\t%d\t%d", r.Day.Day, printable(r.Endpoint), printable(r.EventType), r.Committed, r.Delivered, r.DeadLettered, r.Pending)
		for _, f := range sums {
			line += "\t" + strconv.FormatFloat(r.Sums[f], 'f', -1, 64)
			total.Sums[f] += r.Sums[f]
		}
		fmt.Fprintln(tw, line)
		total.Committed += r.Committed
		total.Delivered += r.Delivered
		total.DeadLettered += r.DeadLettered
		total.Pending += r.Pending
	}
	line := fmt.Sprintf("total\t\t\t%d\t%d\t%d\t%d", total.Committed, total.Delivered, total.DeadLettered, total.Pending)
	for _, f := range sums {
		line += "\t" + strconv.FormatFloat(total.Sums[f], 'f', -1, 64)
	}
	fmt.Fprintln(tw, line)
	_ = tw.Flush()
	fmt.Fprintf(stdout, "days of %s, by commit time; pending: neither delivered nor dead-lettered yet\n", tz)
	return exitOK
}

// parseDay reads YYYY-MM-DD as the start of that day in tz; empty is
// the day of def.
func parseDay(s string, def time.Time, tz *time.Location) (time.Time, error) {
	if s == "" {
		y, m, d := def.In(tz).Date()
		return time.Date(y, m, d, 0, 0, 0, 0, tz), nil
	}
	t, err := time.ParseInLocation(time.DateOnly, s, tz)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is not a day (YYYY-MM-DD)", printable(s))
	}
	return t, nil
}

// sumFields are the report_sum fields any row carries, by name.
func sumFields(rows []report.EndpointDay) []string {
	seen := map[string]bool{}
	for _, r := range rows {
		for f := range r.Sums {
			seen[f] = true
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

func prefixed(p string, s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = p + v
	}
	return out
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
