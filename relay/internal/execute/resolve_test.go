package execute

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/deliver"
	"github.com/postbox-relay/postbox/relay/internal/store"
)

// An endpoint's own URL is parsed once, but every attempt to it passes the
// guard of the configuration in force: a literal address the guard refuses
// is refused each time, and allowed once the configuration allows it.
func TestEndpointURLsPassTheCurrentGuard(t *testing.T) {
	ep := config.Endpoint{Name: "own", Configured: true, URL: "http://10.0.0.8:8080/hook", Method: "POST"}
	refusing := &config.Config{MaxBody: 1 << 20, Endpoints: map[string]config.Endpoint{"own": ep}}
	allowing := &config.Config{MaxBody: 1 << 20, Endpoints: map[string]config.Endpoint{"own": ep},
		Guard: deliver.Guard{Allowed: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}}
	ev := Event{EventID: "e", Endpoint: "own", Payload: []byte(`{}`)}
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
	cfg0 := &config.Config{MaxBody: 1 << 20, Endpoints: map[string]config.Endpoint{"rows": row}, Guard: deliver.Guard{AllowAll: true}}
	got := Resolve(cfg0, Event{EventID: "e", Endpoint: "rows", URL: "https://u:p@pb.example/x?click_id=c1#f", Payload: []byte(`{}`)})
	require.Empty(t, got.Reason)
	require.Equal(t, "https://pb.example/x", got.Recorded)

	bad := config.Endpoint{Name: "bad", Configured: true, URL: "ftp://files.example/x", Method: "POST"}
	cfg := &config.Config{MaxBody: 1 << 20, Endpoints: map[string]config.Endpoint{"bad": bad}}
	for range 2 {
		got := Resolve(cfg, Event{EventID: "e", Endpoint: "bad", Payload: []byte(`{}`)})
		require.True(t, strings.HasPrefix(got.Reason, "invalid_url: "), got.Reason)
	}
}

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
		return Resolve(cfg, Event{EventID: "e", Endpoint: endpoint, URL: url, Payload: []byte(`{"token":"123:tgSecret"}`)})
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
	got := Resolve(reloaded, Event{EventID: "e", Endpoint: "slack", Payload: []byte(`{}`)})
	require.Equal(t, "https://hooks.slack.example/services/***/***/***", got.Recorded)
}

// TestOverlongEndpointNameIsRefused: a name over store.MaxEndpointLen
// bytes, as a row or as the cut name a replay reads back, is an invalid
// row, even with a URL of its own; one of exactly the limit is not.
func TestOverlongEndpointNameIsRefused(t *testing.T) {
	cfg := &config.Config{MaxBody: 1 << 20, Guard: deliver.Guard{AllowAll: true}}
	for _, name := range []string{strings.Repeat("a", store.MaxEndpointLen+1), store.StoredEndpoint(strings.Repeat("é", 500))} {
		got := Resolve(cfg, Event{EventID: "e", Endpoint: name, URL: "https://pb.example/x", Payload: []byte(`{}`)})
		require.True(t, strings.HasPrefix(got.Reason, "invalid_row: the endpoint name is "), got.Reason)
	}
	got := Resolve(cfg, Event{EventID: "e", Endpoint: strings.Repeat("a", store.MaxEndpointLen), URL: "https://pb.example/x", Payload: []byte(`{}`)})
	require.Empty(t, got.Reason)
}
