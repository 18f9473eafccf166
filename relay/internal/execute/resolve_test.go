package execute

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/deliver"
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
