package execute

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/macro"
)

// A reload swaps the configuration whole: the next attempt expands the
// URL and body templates as now written and passes the guard now in
// force, whatever was compiled for the configuration before.
func TestResolveFollowsTheConfigurationInForce(t *testing.T) {
	ep := func(url, body, contentType string) *config.Config {
		e := config.Endpoint{Name: "net", Configured: true, URL: url, Method: "POST", Body: &body,
			Headers: map[string]string{"Content-Type": contentType}}
		return &config.Config{MaxBody: 1 << 20, Endpoints: map[string]config.Endpoint{"net": e}}
	}
	before := ep("https://a.example/pb?c={payload.c}", `{"v": "{payload.c}"}`, "application/json")
	after := ep("https://b.example/{payload.c}", `click={payload.c}&n=1`, "application/x-www-form-urlencoded")
	ev := Event{Event: state.Event{EventID: "e", Endpoint: "net", Payload: []byte(`{"c": "x y"}`)}}
	for range 2 {
		got := Resolve(before, ev)
		require.Empty(t, got.Reason)
		require.Equal(t, "https://a.example/pb?c=x+y", got.URL)
		require.Equal(t, `{"v": "x y"}`, string(got.Body))
		got = Resolve(after, ev)
		require.Empty(t, got.Reason)
		require.Equal(t, "https://b.example/x%20y", got.URL)
		require.Equal(t, "click=x+y&n=1", string(got.Body))
	}

	private := ep("http://10.1.2.3/{payload.c}", "", "")
	require.Contains(t, Resolve(private, ev).Reason, "blocked_target")
	private.AllowedCIDRs = []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}
	require.Empty(t, Resolve(private, ev).Reason)
}

// Templates are compiled once per source, and the cache of them stays
// bounded however many sources come and go.
func TestCompiledTemplatesAreBounded(t *testing.T) {
	for i := range maxTemplates + 10 {
		tpl, err := compile(fmt.Sprintf("https://t.example/%d/{event_id}", i), true)
		require.NoError(t, err)
		got, err := tpl.ExpandURL(macro.Values{EventID: "e1"})
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("https://t.example/%d/e1", i), got)
	}
	n := 0
	templates.Range(func(_, _ any) bool { n++; return true })
	require.LessOrEqual(t, n, maxTemplates)

	_, err := compile("https://t.example/{nope}", true)
	require.ErrorContains(t, err, "unknown macro")
	_, err = compile("https://t.example/{nope}", true)
	require.ErrorContains(t, err, "unknown macro", "the error is kept with its source")
}
