package relay_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/postboxtype"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// TestBlockedTargetsAreNeverContacted: with the guard on (the default),
// events aimed at loopback, a name resolving to it, IPv6 loopback, the
// metadata service or a private network become blocked_target dead
// letters, and nothing is dialled: an address literal is refused when the
// request is resolved, a name by the dialer's check before its connect.
// Beneath the guard the relay dials through a tripwire that refuses every
// address and records it, so even a guard that regressed could not reach
// the metadata or private addresses; the test asserts none got there. The
// dialer's own refusal of the metadata addresses is
// TestGuardedDialerRefusesBeforeConnecting's (relay/internal/guard).
func TestBlockedTargetsAreNeverContacted(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.cfg.AllowPrivateTargets = false
	rc := newReceiver(t, nil)
	_, port, _ := net.SplitHostPort(rc.Listener.Addr().String())
	var mu sync.Mutex
	var dialled []string
	tb.start(t, relay.Options{}.WithBeneathGuard(func(ap netip.AddrPort) error {
		mu.Lock()
		dialled = append(dialled, ap.String())
		mu.Unlock()
		return errors.New("tripwire: the guard let " + ap.String() + " through")
	}))
	cases := map[string]string{
		"http://127.0.0.1:" + port + "/hook":      "blocked_target: 127.0.0.1 is loopback",
		"http://localhost:" + port + "/hook":      "blocked_target: ",
		"http://[::1]:" + port + "/hook":          "blocked_target: ::1 is loopback",
		"http://169.254.169.254/latest/meta":      "blocked_target: 169.254.169.254 is the cloud metadata service",
		"http://10.0.0.8/hook":                    "blocked_target: 10.0.0.8 is private (RFC 1918)",
		"http://[fd00:ec2::254]/latest":           "blocked_target: fd00:ec2::254 is the cloud metadata service",
		"http://[::ffff:127.0.0.1]:" + port + "/": "blocked_target: ::ffff:127.0.0.1 is loopback (IPv4-mapped)",
	}
	var ids []string
	var want []string
	for u, reason := range cases {
		ids = append(ids, tb.insert(t, outbox.Event{Endpoint: "row-url", URL: u})...)
		want = append(want, reason)
	}
	tb.waitSettled(t, len(cases), 30*time.Second)
	for i, id := range ids {
		d := tb.delivery(t, id)
		require.Equal(t, postboxtype.DeliveryDeadLetter, d.Status)
		require.True(t, strings.HasPrefix(d.LastError, want[i]), "%q should start with %q", d.LastError, want[i])
	}
	require.Zero(t, rc.count(), "nothing reached the listening receiver")
	mu.Lock()
	require.Empty(t, dialled, "the guard refused every target before a dial")
	mu.Unlock()

	// allowed_cidrs opens a range deliberately.
	tb2 := setup(t)
	tb2.cfg.AllowPrivateTargets = false
	tb2.cfg.AllowedCIDRs = []string{"127.0.0.0/8"}
	require.NoError(t, tb2.cfg.Validate())
	tb2.start(t, relay.Options{})
	ok := tb2.insert(t, outbox.Event{Endpoint: "row-url", URL: "http://localhost:" + port + "/hook"})
	tb2.waitSettled(t, 1, 30*time.Second)
	require.Equal(t, postboxtype.DeliveryDelivered, tb2.delivery(t, ok[0]).Status)
	require.Equal(t, 1, rc.count())
}

// TestGetPostbackTemplate sends an affiliate-style GET postback: the macros
// filled and escaped for their position, no body, signed headers, static
// and per-row headers, and the signature headers not overridable.
func TestGetPostbackTemplate(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	tb.endpoint(t, "aff", rc.URL+"/postback/{payload.offer}?click_id={payload.click_id}&payout={payload.payout}&cur={payload.currency|EUR}&sub1={payload.sub1|}&event={event_type}&id={event_id}",
		func(ec *config.EndpointConfig) {
			ec.Headers = map[string]string{"X-Network": "acme"}
		})
	tb.endpoint(t, "strict", rc.URL+"/pb?cid={payload.click_id}", nil)
	tb.start(t, relay.Options{})
	ids := tb.insert(t,
		outbox.Event{Endpoint: "aff", Type: "conversion", Payload: []byte(`{"click_id":"abc 1&x=2","payout":12.50,"offer":"sale/2026","sub1":null}`),
			Headers: map[string]string{"X-Tenant": "t-9", "Webhook-Signature": "forged", "Host": "evil.example"}},
		outbox.Event{Endpoint: "strict", Payload: []byte(`{"other":1}`)},
	)
	tb.waitSettled(t, 2, 20*time.Second)
	reqs := rc.requests()
	require.Len(t, reqs, 1, "the event missing its macro was not sent")
	r := reqs[0]
	require.Equal(t, http.MethodGet, r.Method)
	require.Empty(t, r.Body, "GET sends no body")
	require.Equal(t, "/postback/sale/2026", r.Path)
	q, err := url.ParseQuery(r.Query)
	require.NoError(t, err)
	require.Equal(t, "abc 1&x=2", q.Get("click_id"))
	require.Equal(t, "12.50", q.Get("payout"))
	require.Equal(t, "EUR", q.Get("cur"))
	require.Equal(t, "", q.Get("sub1"))
	require.Equal(t, "conversion", q.Get("event"))
	require.Equal(t, ids[0], q.Get("id"))
	require.Equal(t, "acme", r.Header.Get("X-Network"))
	require.Equal(t, "t-9", r.Header.Get("X-Tenant"))
	require.NotEqual(t, "forged", r.Header.Get("Webhook-Signature"))
	// The signature covers the request target, query and all: a captured
	// postback replayed with another payout does not verify.
	require.NoError(t, outbox.Verify([]string{tb.secret}, r.Header, []byte(r.Target), time.Now()), "signed over the request target")
	require.True(t, strings.HasSuffix(r.Target, "?"+r.Query), r.Target)
	forged := strings.Replace(r.Target, "payout=12.50", "payout=99.00", 1)
	require.NotEqual(t, r.Target, forged)
	require.ErrorIs(t, outbox.Verify([]string{tb.secret}, r.Header, []byte(forged), time.Now()), outbox.ErrNoMatch, "another payout")
	require.ErrorIs(t, outbox.Verify([]string{tb.secret}, r.Header, nil, time.Now()), outbox.ErrNoMatch, "not over an empty body")

	d := tb.delivery(t, ids[1])
	require.Equal(t, postboxtype.DeliveryDeadLetter, d.Status)
	require.Equal(t, "template_error: {payload.click_id} has no value (give it a default: {payload.click_id|…})", d.LastError)
}

func TestPostBodyTemplate(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	body := `{"click":"{payload.click_id}","amount":{payload.payout},"id":"{event_id}"}`
	tb.endpoint(t, "json", rc.URL, func(ec *config.EndpointConfig) { ec.Body = &body })
	form := "cid={payload.click_id}&amt={payload.payout}"
	tb.endpoint(t, "form", rc.URL, func(ec *config.EndpointConfig) {
		ec.Body = &form
		ec.Headers = map[string]string{"Content-Type": "application/x-www-form-urlencoded"}
	})
	tb.start(t, relay.Options{})
	ids := tb.insert(t,
		outbox.Event{Endpoint: "json", Payload: []byte(`{"click_id":"a\"b","payout":3.5}`)},
		outbox.Event{Endpoint: "form", Payload: []byte(`{"click_id":"a b&c","payout":3.5}`)},
	)
	tb.waitSettled(t, 2, 20*time.Second)
	got := map[string]received{}
	for _, r := range rc.requests() {
		got[r.ID] = r
	}
	require.JSONEq(t, fmt.Sprintf(`{"click":"a\"b","amount":3.5,"id":%q}`, ids[0]), string(got[ids[0]].Body))
	require.Equal(t, "cid=a+b%26c&amt=3.5", string(got[ids[1]].Body))
	require.Equal(t, "application/x-www-form-urlencoded", got[ids[1]].Header.Get("Content-Type"))
	require.NoError(t, outbox.Verify([]string{tb.secret}, got[ids[1]].Header, got[ids[1]].Body, time.Now()), "the signature covers the body sent")
}

// A row that names an endpoint configured with a url may not send that
// endpoint's headers and signature to a url of its own, unless the
// endpoint sets allow_row_url; an endpoint configured without a url (its
// settings only) takes the row's url.
func TestRowURLsAndConfiguredEndpoints(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	partner := newReceiver(t, nil)
	elsewhere := newReceiver(t, nil)
	withAuth := func(ec *config.EndpointConfig) {
		ec.Headers = map[string]string{"Authorization": "Bearer partner-token"}
	}
	tb.endpoint(t, "partner", partner.URL+"/hook", withAuth)
	tb.endpoint(t, "open", partner.URL+"/open", func(ec *config.EndpointConfig) {
		withAuth(ec)
		allow := true
		ec.AllowRowURL = &allow
	})
	tb.endpoint(t, "settings-only", partner.URL, nil)
	ec := tb.cfg.Endpoints["settings-only"]
	ec.URL = nil
	tb.cfg.Endpoints["settings-only"] = ec
	tb.start(t, relay.Options{})

	ids := tb.insert(t,
		outbox.Event{Endpoint: "partner", URL: elsewhere.URL + "/steal"},
		outbox.Event{Endpoint: "partner"},
		outbox.Event{Endpoint: "open", URL: elsewhere.URL + "/chosen"},
		outbox.Event{Endpoint: "settings-only", URL: elsewhere.URL + "/row"})
	tb.waitSettled(t, 4, 30*time.Second)

	refused := tb.delivery(t, ids[0])
	require.Equal(t, postboxtype.DeliveryDeadLetter, refused.Status)
	require.Contains(t, refused.LastError, "row_url_not_allowed")
	require.Equal(t, postboxtype.DeliveryDelivered, tb.delivery(t, ids[1]).Status)
	require.Equal(t, postboxtype.DeliveryDelivered, tb.delivery(t, ids[2]).Status)
	require.Equal(t, postboxtype.DeliveryDelivered, tb.delivery(t, ids[3]).Status)

	var paths []string
	for _, r := range elsewhere.requests() {
		paths = append(paths, r.Path)
		if r.Path == "/steal" {
			t.Fatalf("the partner's request went to the row's url, with Authorization %q", r.Header.Get("Authorization"))
		}
	}
	require.ElementsMatch(t, []string{"/chosen", "/row"}, paths)
	require.Len(t, partner.requests(), 1)
	require.Equal(t, "/hook", partner.requests()[0].Path)
}

// A row's own url never takes configured headers it did not bring. With
// defaults.headers carrying a token, a row naming an endpoint that is not
// configured, its url a listening server, becomes a dead letter naming
// defaults.allow_row_url and the server hears nothing; endpoints that set
// allow_row_url send their headers to rows' urls, to the hosts of their
// row_url_hosts only when listed. Reloaded with defaults.allow_row_url and
// defaults.row_url_hosts, rows naming unconfigured endpoints go to the
// listed host, with the token, and nowhere else.
func TestRowURLsNeverBorrowCredentials(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	rc := newReceiver(t, nil)
	_, port, _ := net.SplitHostPort(rc.Listener.Addr().String())
	byName, byIP := "http://localhost:"+port, "http://127.0.0.1:"+port
	const token = "Bearer operator-token"
	tb.cfg.Defaults.Headers = map[string]string{"Authorization": token}
	yes := true
	tb.cfg.Endpoints = map[string]config.EndpointConfig{
		"listed":   {AllowRowURL: &yes, RowURLHosts: []string{"LOCALHOST"}},
		"open":     {AllowRowURL: &yes},
		"settings": {},
	}
	require.NoError(t, tb.cfg.Validate())
	r := tb.start(t, relay.Options{})

	ids := tb.insert(t,
		outbox.Event{Endpoint: "zzz", URL: byIP + "/steal"},
		outbox.Event{Endpoint: "settings", URL: byIP + "/steal-too"},
		outbox.Event{Endpoint: "listed", URL: byName + "/listed"},
		outbox.Event{Endpoint: "listed", URL: byIP + "/unlisted"},
		outbox.Event{Endpoint: "open", URL: byIP + "/open"})
	tb.waitSettled(t, len(ids), 30*time.Second)
	for i, want := range []string{
		"row_url_not_allowed: defaults.headers go to configured urls only; defaults.allow_row_url: true sends them to rows' urls too",
		"row_url_not_allowed: endpoints.settings.headers go to configured urls only; endpoints.settings.allow_row_url: true",
		"",
		"row_url_not_allowed: 127.0.0.1 is not in endpoints.listed.row_url_hosts",
		"",
	} {
		d := tb.delivery(t, ids[i])
		if want == "" {
			require.Equal(t, postboxtype.DeliveryDelivered, d.Status, ids[i])
			continue
		}
		require.Equal(t, postboxtype.DeliveryDeadLetter, d.Status, want)
		require.True(t, strings.HasPrefix(d.LastError, want), "%q should start with %q", d.LastError, want)
	}
	an, err := telemetry.AnalyzeDeadLetters(context.Background(), tb.pool, "zzz", time.Now().Add(-time.Hour))
	require.NoError(t, err)
	require.Len(t, an, 1)
	require.Contains(t, an[0].Advice, "allow_row_url: true")
	require.Contains(t, an[0].Advice, "row_url_hosts")

	// defaults.allow_row_url opens endpoints that are not configured, to
	// defaults.row_url_hosts.
	tb.cfg.Defaults.AllowRowURL = &yes
	tb.cfg.Defaults.RowURLHosts = []string{"localhost"}
	require.NoError(t, r.Reload(tb.resolved(t)))
	more := tb.insert(t,
		outbox.Event{Endpoint: "zzz", URL: byName + "/allowed"},
		outbox.Event{Endpoint: "zzz", URL: byIP + "/not-listed"})
	tb.waitSettled(t, len(ids)+len(more), 30*time.Second)
	require.Equal(t, postboxtype.DeliveryDelivered, tb.delivery(t, more[0]).Status)
	d := tb.delivery(t, more[1])
	require.Equal(t, postboxtype.DeliveryDeadLetter, d.Status)
	require.Equal(t, "row_url_not_allowed: 127.0.0.1 is not in defaults.row_url_hosts", d.LastError)

	var paths []string
	for _, req := range rc.requests() {
		paths = append(paths, req.Path)
		require.Equal(t, token, req.Header.Get("Authorization"), req.Path)
	}
	require.ElementsMatch(t, []string{"/listed", "/open", "/allowed"}, paths, "the refused rows reached nothing")
	require.NotContains(t, tb.logs.String(), "operator-token", "the token is never logged")
}

// With signing.per_endpoint: derived, each endpoint's deliveries verify
// with its own derived secret and not with the master or another
// endpoint's.
func TestDerivedSecretsSignEachEndpoint(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.cfg.Signing.PerEndpoint = config.PerEndpointDerived
	rc := newReceiver(t, nil)
	tb.endpoint(t, "a", rc.URL+"/a", nil)
	tb.start(t, relay.Options{})
	ids := tb.insert(t, outbox.Event{Endpoint: "a", Payload: []byte(`{"n":1}`)},
		outbox.Event{Endpoint: "row-named", URL: rc.URL + "/row", Payload: []byte(`{"n":2}`)})
	tb.waitSettled(t, 2, 30*time.Second)
	master, err := outbox.ParseSecret(tb.secret)
	require.NoError(t, err)
	byID := map[string]received{}
	for _, r := range rc.requests() {
		byID[r.ID] = r
	}
	for i, name := range []string{"a", "row-named"} {
		r := byID[ids[i]]
		own := outbox.DeriveSecret(master, name).Reveal()
		other := outbox.DeriveSecret(master, "someone-else").Reveal()
		require.NoError(t, outbox.Verify([]string{own}, r.Header, r.Body, time.Now()), name)
		require.ErrorIs(t, outbox.Verify([]string{tb.secret}, r.Header, r.Body, time.Now()), outbox.ErrNoMatch, "%s: not with the master", name)
		require.ErrorIs(t, outbox.Verify([]string{other}, r.Header, r.Body, time.Now()), outbox.ErrNoMatch, "%s: not with another's", name)
	}
}
