package execute

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/dispatch"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/internal/store"
)

// An endpoint's own URL is parsed once, but every attempt to it passes the
// guard of the configuration in force: a literal address the guard refuses
// is refused each time, and allowed once the configuration allows it.
func TestEndpointURLsPassTheCurrentGuard(t *testing.T) {
	ep := config.Endpoint{Name: "own", Configured: true, URL: "http://10.0.0.8:8080/hook", Method: "POST"}
	refusing := &config.Config{MaxBody: 1 << 20, Endpoints: map[string]config.Endpoint{"own": ep}}
	allowing := &config.Config{MaxBody: 1 << 20, Endpoints: map[string]config.Endpoint{"own": ep},
		AllowedCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	ev := Event{Event: state.Event{EventID: "e", Endpoint: "own", Payload: []byte(`{}`)}}
	for range 2 {
		t1 := Resolve(refusing, ev)
		require.True(t, strings.HasPrefix(t1.Reason, "blocked_target: 10.0.0.8 is private"), t1.Reason)
		t2 := Resolve(allowing, ev)
		require.Empty(t, t2.Reason)
		require.Equal(t, ep.URL, t2.URL)
		require.Equal(t, "http://10.0.0.8:8080/hook", t2.Recorded)
	}

	// A row's URL is recorded without its query string and user info.
	row := config.Endpoint{Name: "rows", Configured: true, Method: "GET"}
	cfg0 := &config.Config{MaxBody: 1 << 20, Endpoints: map[string]config.Endpoint{"rows": row}, AllowPrivateTargets: true}
	got := Resolve(cfg0, Event{Event: state.Event{EventID: "e", Endpoint: "rows", URL: "https://u:p@pb.example/x?click_id=c1#f", Payload: []byte(`{}`)}})
	require.Empty(t, got.Reason)
	require.Equal(t, "https://pb.example/x", got.Recorded)

	bad := config.Endpoint{Name: "bad", Configured: true, URL: "ftp://files.example/x", Method: "POST"}
	cfg := &config.Config{MaxBody: 1 << 20, Endpoints: map[string]config.Endpoint{"bad": bad}}
	for range 2 {
		got := Resolve(cfg, Event{Event: state.Event{EventID: "e", Endpoint: "bad", Payload: []byte(`{}`)}})
		require.True(t, strings.HasPrefix(got.Reason, "invalid_url: "), got.Reason)
	}
}

// A row's own URL never takes configured headers it did not bring: a row
// naming an endpoint that is not configured, or one configured without a
// url, is refused while defaults.headers or the endpoint's are set and
// allow_row_url is not, naming the key to set; with allow_row_url, only
// to row_url_hosts when listed; without headers it goes as before, but
// never outside a list.
func TestRowURLsNeverBorrowCredentials(t *testing.T) {
	t.Parallel()
	yes := true
	resolve := func(edit func(f *config.File)) *config.Config {
		f := config.Default()
		f.Endpoints = map[string]config.EndpointConfig{}
		edit(f)
		cfg, err := f.Resolve()
		require.NoError(t, err)
		return cfg
	}
	auth := map[string]string{"Authorization": "Bearer operator-token"}
	check := func(cfg *config.Config, endpoint, rowURL, reason string) {
		t.Helper()
		got := Resolve(cfg, Event{Event: state.Event{EventID: "e", Endpoint: endpoint, URL: rowURL, Payload: []byte(`{}`)}})
		if reason == "" {
			require.Empty(t, got.Reason, "%s %s", endpoint, rowURL)
			require.Equal(t, rowURL, got.URL)
			return
		}
		require.Equal(t, reason, got.Reason, "%s %s", endpoint, rowURL)
	}
	const refused = "row_url_not_allowed: "

	// The case: defaults.headers carries a token.
	cfg := resolve(func(f *config.File) {
		f.Defaults.Headers = auth
		f.Endpoints["settings"] = config.EndpointConfig{}
		f.Endpoints["defaults-only"] = config.EndpointConfig{Timeout: ptr(config.Duration(time.Second))}
	})
	check(cfg, "zzz", "https://elsewhere.example/", refused+
		"defaults.headers go to configured urls only; defaults.allow_row_url: true sends them to rows' urls too (defaults.row_url_hosts names which hosts)")
	check(cfg, "settings", "https://elsewhere.example/", refused+
		"endpoints.settings.headers go to configured urls only; endpoints.settings.allow_row_url: true sends them to rows' urls too (endpoints.settings.row_url_hosts names which hosts)")
	check(cfg, "defaults-only", "https://elsewhere.example/", refused+
		"endpoints.defaults-only.headers go to configured urls only; endpoints.defaults-only.allow_row_url: true sends them to rows' urls too (endpoints.defaults-only.row_url_hosts names which hosts)")

	// allow_row_url without a list: any host, headers and all.
	cfg = resolve(func(f *config.File) {
		f.Defaults.Headers, f.Defaults.AllowRowURL = auth, &yes
		f.Endpoints["settings"] = config.EndpointConfig{}
		f.Endpoints["open"] = config.EndpointConfig{AllowRowURL: &yes}
	})
	check(cfg, "zzz", "https://elsewhere.example/pb", "")
	check(cfg, "open", "https://elsewhere.example/pb", "")
	check(cfg, "settings", "https://elsewhere.example/pb", refused+
		"endpoints.settings.headers go to configured urls only; endpoints.settings.allow_row_url: true sends them to rows' urls too (endpoints.settings.row_url_hosts names which hosts)")

	// allow_row_url with a list: those hosts only, as the dialer sees them.
	cfg = resolve(func(f *config.File) {
		f.Defaults.Headers, f.Defaults.AllowRowURL = auth, &yes
		f.Defaults.RowURLHosts = []string{"pb.example.com", "*.track.example"}
		f.Endpoints["open"] = config.EndpointConfig{AllowRowURL: &yes}
	})
	for _, ok := range []string{"https://pb.example.com/x?c=1", "https://PB.Example.COM.:8443/x", "http://a.b.track.example/{event_id}",
		"https://evil.example%2f@pb.example.com/"} { // user info, the row's own, to a listed host
		got := Resolve(cfg, Event{Event: state.Event{EventID: "e", Endpoint: "zzz", URL: ok, Payload: []byte(`{}`)}})
		require.Empty(t, got.Reason, ok)
	}
	for u, host := range map[string]string{
		"https://evil.example/?h=pb.example.com":    "evil.example",
		"https://pb.example.com@evil.example/":      "evil.example",
		"https://pb.example.com.evil.example/":      "pb.example.com.evil.example",
		"https://track.example/":                    "track.example",
		"https://{payload.h}/":                      "",
		"http://93.184.216.34/pb":                   "93.184.216.34",
		"https://xtrack.example/":                   "xtrack.example",
		"https://evil.example/#pb.example.com":      "evil.example",
		"https://evil.example\\@pb.example.com/":    "",
		"https://pb.example.com%2e.evil.example/x/": "",
	} {
		got := Resolve(cfg, Event{Event: state.Event{EventID: "e", Endpoint: "zzz", URL: u, Payload: []byte(`{"h":"pb.example.com"}`)}})
		require.True(t, strings.HasPrefix(got.Reason, refused) || strings.HasPrefix(got.Reason, "invalid_url: ") || strings.HasPrefix(got.Reason, "template_error: "), "%s: %q", u, got.Reason)
		if host != "" {
			require.Equal(t, refused+host+" is not in defaults.row_url_hosts", got.Reason, u)
		}
	}
	check(cfg, "open", "https://elsewhere.example/", refused+"elsewhere.example is not in endpoints.open.row_url_hosts")
	check(cfg, "open", "https://pb.example.com/", "")

	// No headers anywhere: a row's url goes as before, outside a list too;
	// a list binds it all the same.
	cfg = resolve(func(f *config.File) { f.Endpoints["settings"] = config.EndpointConfig{} })
	check(cfg, "zzz", "https://anywhere.example/", "")
	check(cfg, "settings", "https://anywhere.example/", "")
	cfg = resolve(func(f *config.File) { f.Defaults.RowURLHosts = []string{"pb.example.com"} })
	check(cfg, "zzz", "https://pb.example.com/", "")
	check(cfg, "zzz", "https://anywhere.example/", refused+"anywhere.example is not in defaults.row_url_hosts")

	// An endpoint's own url takes its headers as always, whatever the list.
	cfg = resolve(func(f *config.File) {
		f.Defaults.Headers, f.Defaults.RowURLHosts = auth, []string{"pb.example.com"}
		u := "https://partner.example/hook"
		f.Endpoints["partner"] = config.EndpointConfig{URL: &u}
	})
	got := Resolve(cfg, Event{Event: state.Event{EventID: "e", Endpoint: "partner", Payload: []byte(`{}`)}})
	require.Equal(t, "https://partner.example/hook", got.URL)
	require.Equal(t, "Bearer operator-token", requestHeader(got.Endpoint, nil).Get("Authorization"))
	check(cfg, "partner", "https://pb.example.com/", refused+
		"endpoint \"partner\" has a url of its own; endpoints.partner.allow_row_url: true lets its rows give another")
}

func ptr[T any](v T) *T { return &v }

// TestRedactPathIsRecorded: redact_path's segments are *** in what an
// attempt records, for an endpoint's own URL (cached), a template's and a
// row's under the defaults' redact_path: true; the request still goes to
// the real path. A reload that changes redact_path applies to the cached
// URL too.
func TestRedactPathIsRecorded(t *testing.T) {
	parse := func(yaml string) *config.Config {
		t.Helper()
		cfg, err := config.Parse([]byte(yaml))
		require.NoError(t, err)
		return cfg
	}
	cfg := parse(`allow_private_targets: true
defaults:
  redact_path: true
endpoints:
  slack:
    url: https://hooks.slack.example/services/T0001/B0002/xoxSecretPart?x=1
    redact_path: [4]
  telegram:
    url: https://api.telegram.example/bot{payload.token}/sendMessage
    redact_path: [1]
  plain:
    url: https://plain.example/a/b
    redact_path: false
  inherits:
    url: https://inherits.example/a/b
`)
	ev := func(endpoint, url string) Target {
		return Resolve(cfg, Event{Event: state.Event{EventID: "e", Endpoint: endpoint, URL: url, Payload: []byte(`{"token":"123:tgSecret"}`)}})
	}
	for range 2 { // the second from the cache
		s := ev("slack", "")
		require.Empty(t, s.Reason)
		require.Equal(t, "https://hooks.slack.example/services/T0001/B0002/xoxSecretPart?x=1", s.URL, "sent to the real path")
		require.Equal(t, "https://hooks.slack.example/services/T0001/B0002/***", s.Recorded)
	}
	tg := ev("telegram", "")
	require.Contains(t, tg.URL, "123:tgSecret")
	require.Equal(t, "https://api.telegram.example/***/sendMessage", tg.Recorded)
	require.Equal(t, "https://plain.example/a/b", ev("plain", "").Recorded, "an endpoint's own setting replaces the defaults'")
	require.Equal(t, "https://inherits.example/***/***", ev("inherits", "").Recorded)
	row := ev("ghost", "https://pb.example/u/9/s%2Fecret/?k=v")
	require.Empty(t, row.Reason)
	require.Equal(t, "https://pb.example/***/***/***/", row.Recorded, "unconfigured: the defaults', every segment")
	require.Equal(t, "https://hooks.slack.example/services/T0001/B0002/***?x=1", loggedURL(ev("slack", "").URL, cfg.Endpoints["slack"].RedactPath))

	reloaded := parse(`endpoints:
  slack:
    url: https://hooks.slack.example/services/T0001/B0002/xoxSecretPart?x=1
    redact_path: [2, 3, 4]
`)
	got := Resolve(reloaded, Event{Event: state.Event{EventID: "e", Endpoint: "slack", Payload: []byte(`{}`)}})
	require.Equal(t, "https://hooks.slack.example/services/***/***/***", got.Recorded)
}

// TestOverlongEndpointNameIsRefused: a name over store.MaxEndpointLen
// bytes, as a row or as the cut name a replay reads back, is an invalid
// row, even with a URL of its own; one of exactly the limit is not.
func TestOverlongEndpointNameIsRefused(t *testing.T) {
	cfg := &config.Config{MaxBody: 1 << 20, AllowPrivateTargets: true}
	for _, name := range []string{strings.Repeat("a", store.MaxEndpointLen+1), store.StoredEndpoint(strings.Repeat("é", 500))} {
		got := Resolve(cfg, Event{Event: state.Event{EventID: "e", Endpoint: name, URL: "https://pb.example/x", Payload: []byte(`{}`)}})
		require.True(t, strings.HasPrefix(got.Reason, "invalid_row: the endpoint name is "), got.Reason)
	}
	got := Resolve(cfg, Event{Event: state.Event{EventID: "e", Endpoint: strings.Repeat("a", store.MaxEndpointLen), URL: "https://pb.example/x", Payload: []byte(`{}`)}})
	require.Empty(t, got.Reason)
}

// A first attempt sends the request the ingest resolved for it while the
// configuration it was resolved under is in force; after a reload, and for
// any attempt without one, the request is resolved under the configuration
// in force.
func TestAFirstAttemptSendsWhatTheIngestResolved(t *testing.T) {
	ep := config.Endpoint{Name: "own", Configured: true, URL: "http://a.test/hook", Method: "POST"}
	before := &config.Config{MaxBody: 1 << 20, Endpoints: map[string]config.Endpoint{"own": ep}, AllowPrivateTargets: true}
	ep.URL = "http://b.test/hook"
	after := &config.Config{MaxBody: 1 << 20, Endpoints: map[string]config.Endpoint{"own": ep}, AllowPrivateTargets: true}
	ev := state.Event{EventID: "e", Endpoint: "own", Payload: []byte(`{}`)}
	job := func() *dispatch.Job {
		return &dispatch.Job{Event: ev, Attempt: 1, Resolved: &Resolved{Config: before, Target: Resolve(before, Event{Event: ev})}}
	}

	j := job()
	require.Equal(t, "http://a.test/hook", resolved(before, j).URL)
	require.Nil(t, j.Resolved, "used once")
	require.Equal(t, "http://b.test/hook", resolved(after, job()).URL, "reloaded since: resolved again")
	require.Equal(t, "http://a.test/hook", resolved(before, &dispatch.Job{Event: ev, Attempt: 2}).URL)
}
