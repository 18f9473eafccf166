package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/postbox-relay/postbox/relay"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/ops"
)

const portalUsage = "usage: postbox portal link --endpoint NAME [--ttl 30d] [--tz ZONE] | postbox portal revoke --endpoint NAME"

// cmdPortal makes and revokes partner portal links.
func cmdPortal(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "link" && args[0] != "revoke") {
		fmt.Fprintln(stderr, portalUsage)
		return exitUsage
	}
	sub := args[0]
	fs := flag.NewFlagSet("postbox portal "+sub, flag.ContinueOnError)
	endpoint := fs.String("endpoint", "", "the partner's endpoint")
	ttl, tz := new(string), new(string)
	if sub == "link" {
		ttl = fs.String("ttl", "30d", "how long the link opens the portal: 30d, 12h, …")
		tz = fs.String("tz", "", "the time zone the partner's report opens in (Europe/Malta; default UTC)")
	}
	env, done, code := openOps(ctx, fs, args[1:], stdout, stderr)
	if env == nil {
		return code
	}
	defer done()
	if *endpoint == "" || len(env.args) > 0 {
		fmt.Fprintln(stderr, portalUsage)
		return exitUsage
	}
	if _, inFile := env.cfg.Endpoints[*endpoint]; !inFile {
		tes, err := ops.TableEndpoints(ctx, env.pool, *endpoint)
		if err != nil {
			fmt.Fprintln(stderr, "postbox:", err)
			return exitFailure
		}
		if len(tes) == 0 {
			fmt.Fprintf(stderr, "warning: no endpoint %s is configured (file or postbox.endpoints): check the name\n", printable(*endpoint))
		}
	}
	if sub == "revoke" {
		v, err := relay.RevokePortal(ctx, env.pool, *endpoint)
		if err != nil {
			fmt.Fprintln(stderr, "postbox:", err)
			return exitFailure
		}
		if env.json {
			return printJSON(stdout, map[string]any{"endpoint": *endpoint, "portal_version": v})
		}
		fmt.Fprintf(stdout, "revoked every portal link and session of %s (portal version now %d); make a new one with: postbox portal link --endpoint %s\n",
			printable(*endpoint), v, printable(*endpoint))
		return exitOK
	}
	d, err := parseTTL(*ttl)
	if err != nil || d <= 0 {
		fmt.Fprintln(stderr, "postbox: --ttl: want a positive duration such as 30d or 12h")
		return exitUsage
	}
	if len(env.cfg.Portal.Key) == 0 {
		fmt.Fprintln(stderr, "postbox: no key to sign portal links: set portal.key (or "+config.EnvPortalKey+"), or signing.secrets to derive one")
		return exitUsage
	}
	l, err := relay.NewPortalLinkIn(ctx, env.pool, env.cfg, *endpoint, d, *tz)
	if err != nil {
		fmt.Fprintln(stderr, "postbox:", err)
		return exitFailure
	}
	if env.json {
		return printJSON(stdout, map[string]any{"endpoint": *endpoint, "url": l.URL, "link_id": l.LinkID, "expires": l.Expires.UTC()})
	}
	fmt.Fprintln(stdout, l.URL)
	fmt.Fprintf(stderr, "portal link %s for %s, valid until %s; anyone holding it sees this endpoint's deliveries: send it privately. Revoke with: postbox portal revoke --endpoint %s\n",
		l.LinkID, printable(*endpoint), l.Expires.UTC().Format(time.RFC3339), printable(*endpoint))
	if env.cfg.Portal.KeyDerived {
		fmt.Fprintln(stderr, "note: the link is signed with a key derived from the newest signing secret: rotating it away ends the link (set portal.key to keep links across rotations)")
	}
	return exitOK
}

func printJSON(w io.Writer, v any) int {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return exitFailure
	}
	return exitOK
}

// parseTTL reads a link's life: "30d" (days), or a Go duration ("12h").
func parseTTL(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(strings.TrimSpace(s), "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n <= 0 || n > 3650 {
			return 0, fmt.Errorf("invalid --ttl %q", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	return config.ParseDuration(s)
}
