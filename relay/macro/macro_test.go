package macro_test

import (
	"encoding/json"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/macro"
)

var values = macro.Values{
	EventID:   "8f14e45f-ceea-467f-a8f1-3d9d1a2b3c4d",
	EventType: "conversion",
	Endpoint:  "partner-42",
	CreatedAt: time.Date(2026, 12, 2, 13, 14, 15, 0, time.FixedZone("CET", 3600)),
	Payload: []byte(`{"click_id": "abc&d=1 x/y", "payout": 12.50, "unicode": "Zürich 東京",
		"items": [{"sku": "A/1"}, {"sku": "B 2"}], "flag": true, "nothing": null, "nested": {"deep": {"v": "ok"}}}`),
}

func expandURL(t *testing.T, tpl string) string {
	t.Helper()
	tp, err := macro.Parse(tpl, true)
	require.NoError(t, err)
	out, err := tp.ExpandURL(values)
	require.NoError(t, err)
	return out
}

func TestTemplateEncodesByPosition(t *testing.T) {
	t.Parallel()
	got := expandURL(t, "https://t.example/pb/{payload.items.0.sku}/{event_type}?cid={payload.click_id}&payout={payload.payout}&city={payload.unicode}&id={event_id}&ep={endpoint}&at={created_at}&sku={payload.items.1.sku}&f={payload.flag}&deep={payload.nested.deep.v}")
	require.Equal(t, "https://t.example/pb/A%2F1/conversion?cid=abc%26d%3D1+x%2Fy&payout=12.50&city=Z%C3%BCrich+%E6%9D%B1%E4%BA%AC&id=8f14e45f-ceea-467f-a8f1-3d9d1a2b3c4d&ep=partner-42&at=2026-12-02T12%3A14%3A15Z&sku=B+2&f=true&deep=ok", got)
	u, err := url.Parse(got)
	require.NoError(t, err)
	require.Equal(t, "abc&d=1 x/y", u.Query().Get("cid"), "a value with & = space / stays one query value")
	require.Equal(t, "Zürich 東京", u.Query().Get("city"))
	require.Equal(t, "/pb/A/1/conversion", u.Path)
	require.Equal(t, "/pb/A%2F1/conversion", u.EscapedPath(), "a / in a value stays inside its path segment")
}

func TestTemplateDefaultsAndMissing(t *testing.T) {
	t.Parallel()
	require.Equal(t, "https://t.example/?s1=&s2=none&n=x", expandURL(t, "https://t.example/?s1={payload.sub1|}&s2={payload.sub2|none}&n={payload.nothing|x}"))
	tp, err := macro.Parse("https://t.example/?cid={payload.click}", true)
	require.NoError(t, err)
	_, err = tp.ExpandURL(values)
	require.ErrorIs(t, err, macro.ErrTemplate)
	require.Contains(t, err.Error(), "{payload.click} has no value")
	tp, _ = macro.Parse("https://t.example/?x={payload.items}", true)
	_, err = tp.ExpandURL(values)
	require.True(t, errors.Is(err, macro.ErrTemplate))
	require.Contains(t, err.Error(), "not a value")
}

func TestTemplateRefusesBadSyntax(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{
		"https://{payload.host}/x", "https://t.example/{payload}", "https://t.example/{nope}",
		"https://t.example/{event_id.x}", "https://t.example/{unclosed", "https://t.example/}",
	} {
		_, err := macro.Parse(bad, true)
		require.Error(t, err, bad)
	}
}

func TestBodyTemplate(t *testing.T) {
	t.Parallel()
	tp, err := macro.Parse(`{"click":"{payload.click_id}","amount":{payload.payout},"note":"{payload.quote|he said "hi"}"}`, false)
	require.NoError(t, err)
	out, err := tp.ExpandJSON(values)
	require.NoError(t, err)
	require.JSONEq(t, `{"click":"abc&d=1 x/y","amount":12.50,"note":"he said \"hi\""}`, out)
	form, _ := macro.Parse("cid={payload.click_id}&amt={payload.payout}", false)
	out, err = form.ExpandBody(values, url.QueryEscape)
	require.NoError(t, err)
	require.Equal(t, "cid=abc%26d%3D1+x%2Fy&amt=12.50", out)
}

// A macro outside a JSON string's quotes is inserted as one JSON value: a
// number or literal as it is, anything else quoted whole, so a payload
// value cannot add keys to the body.
func TestBodyMacrosOutsideQuotesAreOneValue(t *testing.T) {
	t.Parallel()
	tp, err := macro.Parse(`{"amount": {payload.amount}, "ok": {payload.ok}, "note": "{payload.amount}", "esc": "a\\", "after": {payload.amount}}`, false)
	require.NoError(t, err)
	evil := values
	evil.Payload = []byte(`{"amount": "1, \"admin\": true", "ok": true}`)
	out, err := tp.ExpandJSON(evil)
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	require.Len(t, doc, 5, "no key added: %s", out)
	require.Equal(t, `1, "admin": true`, doc["amount"])
	require.Equal(t, `1, "admin": true`, doc["after"], "after an escaped backslash the quotes still pair up")
	require.Equal(t, true, doc["ok"])
	require.Equal(t, `1, "admin": true`, doc["note"])

	plain := values
	plain.Payload = []byte(`{"amount": 12.5, "ok": false}`)
	out, err = tp.ExpandJSON(plain)
	require.NoError(t, err)
	require.JSONEq(t, `{"amount": 12.5, "ok": false, "note": "12.5", "esc": "a\\", "after": 12.5}`, out)
}

// A path macro whose value is "." or ".." is refused: the request would
// go elsewhere on the partner's host.
func TestPathMacrosRefuseDots(t *testing.T) {
	t.Parallel()
	tp, err := macro.Parse("https://t.example/pb/{payload.seg}/x?v={payload.seg}", true)
	require.NoError(t, err)
	for _, seg := range []string{".", ".."} {
		v := values
		v.Payload = []byte(`{"seg": "` + seg + `"}`)
		_, err := tp.ExpandURL(v)
		require.ErrorIs(t, err, macro.ErrTemplate, seg)
	}
	v := values
	v.Payload = []byte(`{"seg": "..."}`)
	out, err := tp.ExpandURL(v)
	require.NoError(t, err)
	require.Equal(t, "https://t.example/pb/.../x?v=...", out)
	q, err := macro.Parse("https://t.example/pb?v={payload.seg}", true)
	require.NoError(t, err)
	v.Payload = []byte(`{"seg": ".."}`)
	out, err = q.ExpandURL(v)
	require.NoError(t, err, "in the query a dot is only a value")
	require.Equal(t, "https://t.example/pb?v=..", out)
}
