package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/postbox-relay/postbox/relay/postboxtype"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// payloadPairs collects repeated --payload KEY=VALUE flags.
type payloadPairs map[string]string

func (p payloadPairs) String() string {
	pairs := make([]string, 0, len(p))
	for k, v := range p {
		pairs = append(pairs, k+"="+v)
	}
	return strings.Join(pairs, ",")
}

func (p payloadPairs) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return errors.New("want KEY=VALUE, KEY one of the configuration's search_keys")
	}
	p[k] = val
	return nil
}

// timeFormat prints the times of a story: to the millisecond, in UTC.
const timeFormat = "2006-01-02T15:04:05.000Z07:00"

func cmdEvents(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("postbox events", flag.ContinueOnError)
	var f telemetry.EventFilter
	payload := payloadPairs{}
	fs.StringVar(&f.Endpoint, "endpoint", "", "only this endpoint's events")
	fs.StringVar(&f.Type, "type", "", "only events of this event type")
	fs.StringVar(&f.After, "after", "", "CURSOR: the next page, older than the last event of the previous one (its cursor is printed when it is full)")
	fs.StringVar(&f.Status, "status", "", "only events whose latest delivery is in this state ("+strings.Join(telemetry.EventStatuses, ", ")+")")
	sinceText := fs.String("since", "", "events committed since: a duration (2h, 7d) or a time (RFC 3339)")
	untilText := fs.String("until", "", "events committed before: a duration ago or a time")
	fs.Var(payload, "payload", "KEY=VALUE: events whose payload field KEY (one of search_keys) is VALUE (repeat: all must match)")
	fs.IntVar(&f.Limit, "limit", telemetry.EventLimitDefault, fmt.Sprintf("list at most this many (at most %d)", telemetry.EventLimitMax))
	env, closeEnv, code := openOps(ctx, fs, args, stdout, stderr)
	if env == nil {
		return code
	}
	defer closeEnv()
	if len(env.args) > 0 {
		fmt.Fprintf(stderr, "postbox: events: unexpected %q (one event's story: postbox event ID)\n", printable(env.args[0]))
		return exitUsage
	}
	var ok bool
	if f.Since, f.Until, ok = parseWindow(*sinceText, *untilText, stderr); !ok {
		return exitUsage
	}
	if f.Limit < 1 || f.Limit > telemetry.EventLimitMax {
		fmt.Fprintf(stderr, "postbox: --limit: want 1 to %d\n", telemetry.EventLimitMax)
		return exitUsage
	}
	if err := telemetry.CheckSearchKeys(env.cfg.SearchKeys, payload); err != nil {
		fmt.Fprintln(stderr, "postbox: --payload:", err)
		return exitUsage
	}
	f.Payload = payload
	evs, next, err := telemetry.SearchEventsPage(ctx, env.pool, f)
	if errors.Is(err, telemetry.ErrUnknownStatus) {
		fmt.Fprintln(stderr, "postbox: --status:", err)
		return exitUsage
	}
	if errors.Is(err, telemetry.ErrBadCursor) {
		fmt.Fprintln(stderr, "postbox: --after:", err)
		return exitUsage
	}
	if err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitFailure
	}
	if env.json {
		env.printJSON(evs)
		if next != "" {
			// The JSON stays a list; the way on goes where a person reads.
			fmt.Fprintf(stderr, "postbox: more events: --after %s\n", next)
		}
		return exitOK
	}
	if len(evs) == 0 {
		fmt.Fprintln(stdout, "no events match")
		return exitOK
	}
	tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "COMMITTED\tEVENT ID\tENDPOINT\tTYPE\tSTATUS\tATTEMPTS")
	for _, e := range evs {
		committed := "-"
		if e.CommittedAt != nil {
			committed = e.CommittedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", committed, e.EventID, printable(e.Endpoint), printable(e.EventType), e.Status, e.Attempts)
	}
	_ = tw.Flush()
	if next != "" {
		fmt.Fprintf(stdout, "(%d events; the next page: --after %s, with the same filters)\n", len(evs), next)
	}
	return exitOK
}

func cmdEvent(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("postbox event", flag.ContinueOnError)
	env, closeEnv, code := openOps(ctx, fs, args, stdout, stderr)
	if env == nil {
		return code
	}
	defer closeEnv()
	if len(env.args) != 1 {
		fmt.Fprintln(stderr, "usage: postbox event EVENT_ID [--json]")
		return exitUsage
	}
	stories, err := telemetry.LoadEvent(ctx, env.pool, env.args[0])
	if err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitFailure
	}
	telemetry.ForOperator(stories, env.cfg)
	if env.json {
		// One event to one endpoint, as almost always: the story itself.
		// An id that went to several endpoints: a list of their stories.
		if len(stories) == 1 {
			env.printJSON(stories[0])
		} else {
			env.printJSON(stories)
		}
		return exitOK
	}
	for i, s := range stories {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		printStory(stdout, s)
	}
	return exitOK
}

// printStory prints an event's story for one endpoint.
func printStory(w io.Writer, s postboxtype.EventStory) {
	typ := ""
	if s.EventType != "" {
		typ = " (" + printable(s.EventType) + ")"
	}
	switch {
	case s.Matched != nil && s.Endpoint == "":
		fmt.Fprintf(w, "event %s%s to no endpoint\n", s.EventID, typ)
		fmt.Fprintln(w, "  matched    no endpoint: routed by its type, to none (the dead letter says why)")
	case s.Matched != nil:
		fmt.Fprintf(w, "event %s%s to %s\n", s.EventID, typ, printable(s.Endpoint))
		fmt.Fprintf(w, "  matched    %s (routed by subscription)\n", printable(*s.Matched))
	default:
		fmt.Fprintf(w, "event %s%s to %s\n", s.EventID, typ, printable(s.Endpoint))
	}
	fmt.Fprintf(w, "  created    %s\n", s.CreatedAt.UTC().Format(timeFormat))
	switch {
	case s.CommittedAt != nil:
		fmt.Fprintf(w, "  committed  %s at LSN %s\n", s.CommittedAt.UTC().Format(timeFormat), s.CommitLSN)
		fmt.Fprintf(w, "  ingested   %s (%s after the commit)\n", s.IngestedAt.UTC().Format(timeFormat), since(*s.CommittedAt, s.IngestedAt))
	default:
		fmt.Fprintf(w, "  committed  unknown: found in the outbox table by reconciliation, not in the stream\n")
		fmt.Fprintf(w, "  ingested   %s\n", s.IngestedAt.UTC().Format(timeFormat))
	}
	switch {
	case s.UnderWayAt != "":
		fmt.Fprintf(w, "  in flight at instance %s (its delivery is written when the attempt ends)\n", printable(s.UnderWayAt))
	case len(s.Deliveries) == 0:
		fmt.Fprintln(w, "  no deliveries")
	}
	for _, d := range s.Deliveries {
		head := fmt.Sprintf("  delivery %d", d.ID)
		if d.ReplayOf != nil {
			head += fmt.Sprintf(" (replay of delivery %d)", *d.ReplayOf)
		}
		switch d.Retarget {
		case "":
		case postboxtype.RetargetEndpointURL:
			head += " to the endpoint's url, not the row's"
		default:
			head += " to " + d.Retarget + ", not the row's url"
		}
		head += ": " + d.Status
		switch {
		case d.DeliveredAt != nil:
			head += " at " + d.DeliveredAt.UTC().Format(timeFormat)
		case d.Status == "replayed":
			head += " (a dead letter a replay superseded)"
		}
		fmt.Fprintln(w, head)
		if len(d.Attempts) == 0 {
			if d.LastError != "" {
				fmt.Fprintf(w, "    no attempt: %s\n", snippet(d.LastError, 200))
			} else {
				fmt.Fprintln(w, "    no attempts yet")
			}
		}
		for _, a := range d.Attempts {
			code := "no response"
			if a.StatusCode != nil {
				code = fmt.Sprintf("HTTP %d", *a.StatusCode)
			}
			line := fmt.Sprintf("    #%d  %s  %s  %s", a.Attempt, a.StartedAt.UTC().Format(timeFormat), code, ms(&a.DurationMS))
			if a.Error != "" {
				line += "  " + snippet(a.Error, 200)
			}
			if a.StartedAt.Before(s.IngestedAt) {
				line += "  (started before its ingest committed: sent from memory as the event was written)"
			}
			switch {
			case a.ResponseHidden:
				line += "  response: hidden: log_payloads is off"
			case a.Response != "":
				line += "  response: " + snippet(a.Response, 80)
			}
			fmt.Fprintln(w, line)
			if a.Sent != "" && a.Sent != a.Target {
				fmt.Fprintf(w, "        sent as %s\n", printable(a.Sent))
			}
		}
		if n := len(d.Attempts); n > 0 && d.LastError != "" && d.LastError != d.Attempts[n-1].Error && d.Status != "delivered" {
			fmt.Fprintf(w, "    last error: %s\n", snippet(d.LastError, 200))
		}
	}
}

// since is how long after from to was, rounded for reading.
func since(from, to time.Time) string {
	d := to.Sub(from)
	switch {
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < time.Second:
		return d.Round(100 * time.Microsecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// snippet is s on one line, without control characters, at most n runes.
func snippet(s string, n int) string {
	s = strings.Join(strings.Fields(strings.Map(func(r rune) rune {
		switch {
		case r == '\n' || r == '\r' || r == '\t':
			return ' '
		case unicode.IsControl(r):
			return -1
		}
		return r
	}, s)), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}
