package console_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// endpointRow is a row of postbox.endpoints as the tests check it.
type endpointRow struct {
	URL, Method, Headers *string
	Timeout              *string
	Enabled              bool
	Revision             int64
}

func (tb *testBundle) endpointRow(t *testing.T, name string) *endpointRow {
	t.Helper()
	var r endpointRow
	err := tb.pool.QueryRow(context.Background(), `SELECT url, method, headers::text, timeout::text, enabled, revision
		FROM postbox.endpoints WHERE name = $1`, name).Scan(&r.URL, &r.Method, &r.Headers, &r.Timeout, &r.Enabled, &r.Revision)
	if err != nil {
		return nil
	}
	return &r
}

// changeLine is a row of postbox.endpoint_changes.
type changeLine struct{ Op, Actor string }

func (tb *testBundle) changes(t *testing.T, name string) []changeLine {
	t.Helper()
	rows, err := tb.pool.Query(context.Background(), `SELECT op, actor FROM postbox.endpoint_changes WHERE name = $1 ORDER BY id`, name)
	require.NoError(t, err)
	defer rows.Close()
	var out []changeLine
	for rows.Next() {
		var c changeLine
		require.NoError(t, rows.Scan(&c.Op, &c.Actor))
		out = append(out, c)
	}
	require.NoError(t, rows.Err())
	return out
}

// form is the endpoint form's fields, all empty but those given.
func form(csrf string, kv ...string) url.Values {
	v := url.Values{"csrf": {csrf}}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Set(kv[i], kv[i+1])
	}
	return v
}

var actorRe = regexp.MustCompile(`^console:s-[0-9a-f]{8}$`)

// TestEndpointFormWritesRowsAndTheChangeLog: create, refused input shown
// on the form (nothing written), edit over the revision read, header
// values never shown, disable, enable, delete; every change logged with
// the console session as actor.
func TestEndpointFormWritesRowsAndTheChangeLog(t *testing.T) {
	t.Parallel()
	tb := setup(t, setupOpts{token: token})
	c := tb.client(t)
	csrf := tb.signIn(t, c)

	a := tb.post(t, c, "/new-endpoint", form(csrf, "name", "aff-7", "url", "https://pb.example/cb?click={payload.click_id}",
		"headers", "X-Api-Key: k-secret-1\nX-Brand: casino", "timeout", "5s", "event_types", "conversion.*, signup"))
	require.Equal(t, http.StatusSeeOther, a.status, a.body)
	require.Equal(t, "/endpoints/aff-7?done=created", a.header.Get("Location"))
	row := tb.endpointRow(t, "aff-7")
	require.NotNil(t, row)
	require.Equal(t, "00:00:05", *row.Timeout)
	require.JSONEq(t, `{"X-Api-Key": "k-secret-1", "X-Brand": "casino"}`, *row.Headers)
	require.True(t, row.Enabled)
	ch := tb.changes(t, "aff-7")
	require.Len(t, ch, 1)
	require.Equal(t, "insert", ch[0].Op)
	require.Regexp(t, actorRe, ch[0].Actor)
	actor := ch[0].Actor

	page := tb.get(t, c, "/endpoints/aff-7")
	require.Equal(t, http.StatusOK, page.status)
	require.NotContains(t, page.body, "k-secret-1", "header values are never shown")
	require.Contains(t, page.body, "X-Api-Key: ***")
	require.Contains(t, page.body, actor, "the change log names the session")

	for _, tc := range []struct{ field, value, want string }{
		{"url", "https://pb.example/cb?x={nope}", "Unknown macro {nope}"},
		{"headers", "Webhook-Signature: forged", "set by postbox"},
		{"timeout", "soon", "not a duration"},
		{"timeout", "-5s", "positive"},
		{"method", "DELETE", "not one of GET, POST, PUT, PATCH"},
		{"filter", "{brand", "not valid JSON"},
	} {
		a := tb.post(t, c, "/new-endpoint", form(csrf, "name", "bad", "url", "https://pb.example/", tc.field, tc.value))
		require.Equal(t, http.StatusUnprocessableEntity, a.status, "%s=%s", tc.field, tc.value)
		m := regexp.MustCompile(`(?s)data-field="` + tc.field + `".*?<div class="error" id="e-` + tc.field + `">([^<]*)</div>`).FindStringSubmatch(a.body)
		require.NotNil(t, m, "%s=%s: the error is shown next to its field", tc.field, tc.value)
		require.Contains(t, m[1], tc.want, "%s=%s", tc.field, tc.value)
		require.Nil(t, tb.endpointRow(t, "bad"), "nothing written")
	}
	// A constraint's refusal (only PostgreSQL checks a name's length).
	a = tb.post(t, c, "/new-endpoint", form(csrf, "name", strings.Repeat("n", 201), "url", "https://x.example/"))
	require.Equal(t, http.StatusUnprocessableEntity, a.status)
	require.Regexp(t, `<div class="error" id="e-name">A name is 1 to 200 bytes long.</div>`, a.body)
	a = tb.post(t, c, "/new-endpoint", form(csrf, "name", "shop", "url", "https://x.example/"))
	require.Equal(t, http.StatusUnprocessableEntity, a.status)
	require.Contains(t, a.body, "The configuration file defines an endpoint of this name")
	a = tb.post(t, c, "/new-endpoint", form(csrf, "name", "aff-7", "url", "https://x.example/"))
	require.Equal(t, http.StatusUnprocessableEntity, a.status)
	require.Contains(t, a.body, "An endpoint of this name exists already.")

	// An edit keeps a header left as *** and changes the URL.
	rev := row.Revision
	edit := form(csrf, "revision", itoa64(rev), "url", "https://pb2.example/cb", "headers", "X-Api-Key: ***\nX-Brand: poker", "timeout", "5s")
	a = tb.post(t, c, "/endpoints/aff-7/edit", edit)
	require.Equal(t, http.StatusSeeOther, a.status, a.body)
	row = tb.endpointRow(t, "aff-7")
	require.Equal(t, "https://pb2.example/cb", *row.URL)
	require.JSONEq(t, `{"X-Api-Key": "k-secret-1", "X-Brand": "poker"}`, *row.Headers)
	// The same form again is over a revision that has passed.
	a = tb.post(t, c, "/endpoints/aff-7/edit", edit)
	require.Equal(t, http.StatusUnprocessableEntity, a.status)
	require.Contains(t, a.body, "changed since you opened the form")

	a = tb.post(t, c, "/endpoints/aff-7/disable", form(csrf))
	require.Equal(t, http.StatusSeeOther, a.status, a.body)
	require.False(t, tb.endpointRow(t, "aff-7").Enabled)
	page = tb.get(t, c, "/endpoints")
	require.Regexp(t, `(?s)data-endpoint="aff-7".*?<td class="source">table.*?pill warn">disabled`, page.body)
	a = tb.post(t, c, "/endpoints/aff-7/enable", form(csrf))
	require.Equal(t, http.StatusSeeOther, a.status, a.body)
	require.True(t, tb.endpointRow(t, "aff-7").Enabled)

	require.Equal(t, http.StatusOK, tb.get(t, c, "/endpoints/aff-7/delete").status)
	a = tb.post(t, c, "/endpoints/aff-7/delete", form(csrf))
	require.Equal(t, http.StatusSeeOther, a.status, a.body)
	require.Equal(t, "/endpoints?done=deleted", a.header.Get("Location"))
	require.Nil(t, tb.endpointRow(t, "aff-7"))

	ch = tb.changes(t, "aff-7")
	ops := make([]string, len(ch))
	for i, l := range ch {
		ops[i] = l.Op
		require.Equal(t, actor, l.Actor, "every change names the session")
	}
	require.Equal(t, []string{"insert", "update", "update", "update", "delete"}, ops)
	page = tb.get(t, c, "/endpoints/aff-7")
	require.Equal(t, http.StatusOK, page.status, "a deleted endpoint's history is still shown")
	require.Contains(t, page.body, "Deleted from postbox.endpoints")
	require.Equal(t, 5, len(regexp.MustCompile(`<tr class="change"`).FindAllString(page.body, -1)))
}

// TestEndpointActionsNeedTheFormToken: the endpoint actions are guarded
// as every action is (sign-in, origin, form token).
func TestEndpointActionsNeedTheFormToken(t *testing.T) {
	t.Parallel()
	tb := setup(t, setupOpts{token: token})
	c := tb.client(t)
	csrf := tb.signIn(t, c)
	_, err := tb.pool.Exec(context.Background(), `INSERT INTO postbox.endpoints (name, url) VALUES ('aff-1', 'https://a.example/')`)
	require.NoError(t, err)
	for _, path := range []string{"/new-endpoint", "/endpoints/aff-1/edit", "/endpoints/aff-1/disable", "/endpoints/aff-1/delete"} {
		a := tb.post(t, c, path, form("wrong", "name", "aff-2", "url", "https://b.example/"))
		require.Equal(t, http.StatusForbidden, a.status, path)
		a = tb.post(t, c, path, form(csrf, "name", "aff-2", "url", "https://b.example/"), header("Origin", "https://evil.example"))
		require.Equal(t, http.StatusForbidden, a.status, path)
		a = tb.post(t, tb.client(t), path, form(csrf, "name", "aff-2", "url", "https://b.example/"))
		require.Equal(t, http.StatusUnauthorized, a.status, path)
	}
	require.Len(t, tb.changes(t, "aff-1"), 1, "only the insert by SQL")
	require.Nil(t, tb.endpointRow(t, "aff-2"))
}

// TestEndpointPagesShowInvalidRowsAndConflicts: a row the relay cannot
// use shows its reason, and a name in both the file and the table says
// the file's settings are used; the file's endpoint is read-only.
func TestEndpointPagesShowInvalidRowsAndConflicts(t *testing.T) {
	t.Parallel()
	tb := setup(t, setupOpts{loopback: true})
	c := tb.client(t)
	_, err := tb.pool.Exec(context.Background(), `INSERT INTO postbox.endpoints (name, url, headers) VALUES
		('aff-bad', 'https://a.example/', '{"Webhook-Id": "x"}'), ('shop', 'https://other.example/', NULL)`)
	require.NoError(t, err)
	page := tb.get(t, c, "/endpoints")
	require.Equal(t, http.StatusOK, page.status)
	require.Regexp(t, `(?s)data-endpoint="aff-bad".*?invalid: headers: Webhook-Id is set by postbox`, page.body)
	require.Regexp(t, `(?s)data-endpoint="shop".*?the file's settings are used.*?<td class="source">file <span class="pill warn">conflict`, page.body)

	page = tb.get(t, c, "/endpoints/aff-bad")
	require.Contains(t, page.body, "Invalid: headers: Webhook-Id is set by postbox")
	require.Contains(t, page.body, "Webhook-Id: ***")
	require.NotContains(t, page.body, `class="epform"`, "no form without the token")
	page = tb.get(t, c, "/endpoints/shop")
	require.Contains(t, page.body, "Defined in the configuration file")
	require.Contains(t, page.body, "the file's settings are used")
}

func itoa64(n int64) string { return strconv.FormatInt(n, 10) }

// TestEditKeepsHeadersLeftMasked: a header left as *** keeps its stored
// value, even one SQL wrote that is not a string (the form then refuses
// the row, invalid for it as before, until the value is written); lines
// end as browsers send them (CRLF); a form without a revision is refused.
func TestEditKeepsHeadersLeftMasked(t *testing.T) {
	t.Parallel()
	tb := setup(t, setupOpts{token: token})
	c := tb.client(t)
	csrf := tb.signIn(t, c)
	_, err := tb.pool.Exec(context.Background(), `INSERT INTO postbox.endpoints (name, url, headers) VALUES ('aff-3', 'https://a.example/', '{"X-N": 1, "X-S": "s-1"}')`)
	require.NoError(t, err)
	page := tb.get(t, c, "/endpoints/aff-3")
	require.Contains(t, page.body, "X-N: ***\nX-S: ***")
	require.Contains(t, page.body, "Invalid: headers: ")
	rev := tb.endpointRow(t, "aff-3").Revision

	a := tb.post(t, c, "/endpoints/aff-3/edit", form(csrf, "url", "https://b.example/", "headers", "X-N: ***\r\nX-S: ***\r\n"))
	require.Equal(t, http.StatusBadRequest, a.status, "no revision")
	a = tb.post(t, c, "/endpoints/aff-3/edit", form(csrf, "revision", itoa64(rev), "url", "https://b.example/", "headers", "X-N: ***\r\nX-S: ***\r\n"))
	require.Equal(t, http.StatusUnprocessableEntity, a.status, "still invalid: a header's value is not a string")
	a = tb.post(t, c, "/endpoints/aff-3/edit", form(csrf, "revision", itoa64(rev), "url", "https://b.example/", "headers", "X-N: 2\r\nX-S: ***\r\n"))
	require.Equal(t, http.StatusSeeOther, a.status, a.body)
	row := tb.endpointRow(t, "aff-3")
	require.Equal(t, "https://b.example/", *row.URL)
	require.JSONEq(t, `{"X-N": "2", "X-S": "s-1"}`, *row.Headers)
}
