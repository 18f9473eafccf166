package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

// endpointsDB is a migrated database and a configuration for it: signing
// secrets, one named secret, and a file endpoint "filed".
func endpointsDB(t *testing.T) (cfg string, query func(sql string, args ...any) string) {
	t.Helper()
	dbURL := pgtest.NewDatabase(t)
	cfg = writeConfig(t, dbURL, fmt.Sprintf(`signing:
  secrets: [%s]
  named:
    partner_x: [%s]
endpoints:
  filed:
    url: https://filed.example/hook
`, outbox.NewSecret(), outbox.NewSecret()))
	code, out, errOut := postbox(t, "migrate", "--config", cfg)
	require.Equal(t, exitOK, code, out+errOut)
	pool := newPool(t, dbURL)
	return cfg, func(sql string, args ...any) string {
		t.Helper()
		var s *string
		require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&s))
		if s == nil {
			return "NULL"
		}
		return *s
	}
}

// TestEndpointsAddSetDisableRm: the commands write the rows the relay
// reads, refuse what the relay would hold as invalid (with the reason)
// and what the table's constraints refuse, change only the keys given,
// and list the table's endpoints beside the file's, conflicts named.
func TestEndpointsAddSetDisableRm(t *testing.T) {
	t.Parallel()
	cfg, query := endpointsDB(t)
	ep := func(args ...string) (int, string, string) {
		return postbox(t, append(append([]string{"endpoints"}, args...), "--config", cfg)...)
	}

	code, out, errOut := ep("add", "aff-1", "--url", "https://t.example/pb?click={payload.click_id}", "--timeout", "10s",
		"--header", "X-Key=k1", "--max-attempts", "7", "--event-types", "conversion,signup.*", "--filter", `{"brand": "b"}`,
		"--retry-on", "409", "--redact-path", "2", "--ordered", "--row-url-hosts", `pb.example.com,*.example.org`)
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `^created aff-1 \(revision \d+\)\n$`, out)
	require.Equal(t, "00:00:10", query(`SELECT timeout::text FROM postbox.endpoints WHERE name = 'aff-1'`))
	require.Equal(t, `{"X-Key": "k1"}`, query(`SELECT headers::text FROM postbox.endpoints WHERE name = 'aff-1'`))
	require.Equal(t, `{conversion,signup.*}`, query(`SELECT event_types::text FROM postbox.endpoints WHERE name = 'aff-1'`))
	require.Equal(t, `{pb.example.com,*.example.org}`, query(`SELECT row_url_hosts::text FROM postbox.endpoints WHERE name = 'aff-1'`))
	require.Equal(t, `[2] {409} t 7 {"brand": "b"}`, query(`SELECT concat_ws(' ', redact_path, retry_on, ordered, max_attempts, filter) FROM postbox.endpoints WHERE name = 'aff-1'`))

	code, _, errOut = ep("add", "aff-1", "--url", "https://t.example/x")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "endpoints set changes it")

	// What only postbox can judge is refused by the command, with the
	// relay's reason; what SQL refuses, by the table's constraint.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--url", "https://t.example/pb?c={payload.click_id"}, "not written: bad is invalid: url"},
		{[]string{"--url", "https://t.example/", "--header", "Content-Type=text/plain"}, "headers: Content-Type is set by postbox"},
		{[]string{"--url", "https://t.example/", "--secret", "nosuch"}, `secret: no secret "nosuch" is declared under signing.named`},
		{[]string{"--url", "https://t.example/", "--rate-limit", "lots"}, "invalid: rate_limit"},
		{[]string{"--url", "https://t.example/", "--max-attempts", "0"}, "max_attempts: refused by postbox.endpoints"},
		{[]string{"--url", "https://t.example/", "--method", "DELETE"}, "method: refused by postbox.endpoints"},
		{[]string{"--url", "https://t.example/", "--timeout", "-5s"}, "--timeout"},
		{[]string{"--url", "https://t.example/", "--filter", "[1]"}, "--filter: want a JSON object"},
		{[]string{"--unset", "colour"}, "--unset: colour is not a key"},
	} {
		code, _, errOut = ep(append([]string{"add", "bad"}, c.args...)...)
		require.Equal(t, exitUsage, code, "%v", c.args)
		require.Contains(t, errOut, c.want, "%v", c.args)
	}
	require.Equal(t, "0", query(`SELECT count(*)::text FROM postbox.endpoints WHERE name = 'bad'`), "nothing written")

	// set changes the keys given alone; success's two parts one at a time.
	code, out, errOut = ep("set", "aff-1", "--rate-limit", "5/s", "--success-status", "200,204")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `^changed aff-1 \(revision \d+\)\n$`, out)
	code, _, errOut = ep("set", "aff-1", "--success-body-contains", "OK", "--unset", "timeout", "--secret", "partner_x")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, `5/s {"status": [200, 204], "body_contains": "OK"} NULL 7 partner_x`,
		query(`SELECT concat_ws(' ', rate_limit, success, coalesce(timeout::text, 'NULL'), max_attempts, secret) FROM postbox.endpoints WHERE name = 'aff-1'`))
	code, _, errOut = ep("set", "nosuch", "--url", "https://t.example/")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "endpoints add creates it")
	code, _, errOut = ep("set", "filed", "--timeout", "5s")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "it is defined in the configuration file; change it there")
	code, _, errOut = ep("set", "aff-1")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "give the keys to change")

	// Every other flag, each to its column; --flag=false and --unset of
	// several keys at once.
	code, _, errOut = ep("add", "aff-all", "--url", "https://t.example/", "--method", "PUT", "--body", `{"id": "{event_id}"}`,
		"--backoff-base", "1s", "--backoff-cap", "1m", "--cooldown", "10s", "--max-cooldown", "2m", "--failure-threshold", "4",
		"--max-in-flight", "3", "--allow-row-url", "--success-status", "202", "--success-body-contains", "ok",
		"--secret-version", "2", "--previous-secret-until", "2030-01-02T03:04:05Z")
	require.Equal(t, exitOK, code, errOut)
	all := `SELECT concat_ws(' | ', method, body, backoff_base, backoff_cap, cooldown, max_cooldown, failure_threshold, max_in_flight,
		allow_row_url, success, secret_version, previous_secret_until AT TIME ZONE 'UTC') FROM postbox.endpoints WHERE name = 'aff-all'`
	require.Equal(t, `PUT | {"id": "{event_id}"} | 00:00:01 | 00:01:00 | 00:00:10 | 00:02:00 | 4 | 3 | t | {"status": [202], "body_contains": "ok"} | 2 | 2030-01-02 03:04:05`, query(all))
	code, _, errOut = ep("set", "aff-all", "--allow-row-url=false", "--unset", "body,method", "--unset", "success")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, `00:00:01 | 00:01:00 | 00:00:10 | 00:02:00 | 4 | 3 | f | 2 | 2030-01-02 03:04:05`, query(all))

	code, out, errOut = ep("disable", "aff-1")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "disabled: its events wait")
	require.Equal(t, "false", query(`SELECT enabled::text FROM postbox.endpoints WHERE name = 'aff-1'`))

	// A name the file defines too: written, and named a conflict. A row
	// written invalid by SQL is listed with its reason.
	code, _, errOut = ep("add", "filed", "--url", "https://other.example/")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, errOut, "filed is defined in the configuration file too: conflict: the file's settings are used")
	query(`INSERT INTO postbox.endpoints (name, url) VALUES ('broken', 'https://t.example/{payload.x') RETURNING name`)
	code, out, errOut = ep()
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^aff-1\s+table\s+no\s+\d+\s+disabled \(its events wait\)$`, out)
	require.Regexp(t, `(?m)^broken\s+table\s+yes\s+\d+\s+invalid: url: .+ \(its events wait\)$`, out)
	require.Regexp(t, `(?m)^filed\s+file\s+yes\s+-\s+ok$`, out)
	require.Regexp(t, `(?m)^filed\s+table\s+yes\s+\d+\s+conflict: the file's settings are used$`, out)
	var list struct {
		Definitions []definition `json:"definitions"`
	}
	code, out, _ = ep("--json", "--endpoint", "broken")
	require.Equal(t, exitOK, code)
	require.NoError(t, json.Unmarshal([]byte(out), &list))
	require.Len(t, list.Definitions, 1)
	require.Equal(t, "table", list.Definitions[0].Source)
	require.Contains(t, list.Definitions[0].Invalid, "url: ")

	// Disabling an invalid row is allowed (its events wait either way);
	// enabling one is refused with its reason.
	code, _, errOut = ep("disable", "broken")
	require.Equal(t, exitOK, code, errOut)
	code, _, errOut = ep("enable", "broken")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "broken is invalid: url")
	code, _, errOut = ep("enable", "aff-1")
	require.Equal(t, exitOK, code, errOut)

	code, out, errOut = ep("rm", "aff-1")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "deleted aff-1")
	code, _, errOut = ep("rm", "aff-1")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "no endpoint aff-1")
}

// TestEndpointsHistory: every change is logged with its role, and history
// shows what changed, header values as ***.
func TestEndpointsHistory(t *testing.T) {
	t.Parallel()
	cfg, query := endpointsDB(t)
	ep := func(args ...string) (int, string, string) {
		return postbox(t, append(append([]string{"endpoints"}, args...), "--config", cfg)...)
	}
	for _, args := range [][]string{
		{"add", "aff-2", "--url", "https://a.example/pb", "--header", "Authorization=Bearer sekrit-1"},
		{"set", "aff-2", "--url", "https://user:sekrit-3@b.example/pb", "--header", "Authorization=Bearer sekrit-2", "--header", "X-Other=o"},
		{"disable", "aff-2"},
		{"rm", "aff-2"},
	} {
		code, _, errOut := ep(args...)
		require.Equal(t, exitOK, code, errOut)
	}
	role := query(`SELECT current_user::text`)
	code, out, errOut := ep("history", "aff-2")
	require.Equal(t, exitOK, code, errOut)
	require.NotContains(t, out, "sekrit")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Regexp(t, `^\S+  insert  revision \d+  by `+role+`$`, lines[0])
	require.Contains(t, out, "  url: (none) → https://a.example/pb\n")
	require.Contains(t, out, "  url: https://a.example/pb → https://user:xxxxx@b.example/pb\n")
	require.Contains(t, out, "  headers.Authorization: *** → ***\n")
	require.Contains(t, out, "  headers.X-Other: (none) → ***\n")
	require.Contains(t, out, "  enabled: true → false\n")
	require.NotContains(t, out, "  name: ", "the entry's own name is not a change")
	require.Regexp(t, `(?m)^\S+  delete  revision \d+  by `+role+`$`, lines[len(lines)-1])

	code, out, _ = ep("history", "aff-2", "--json", "--limit", "2")
	require.Equal(t, exitOK, code)
	require.NotContains(t, out, "sekrit")
	var h struct {
		Changes []struct {
			Op string `json:"op"`
		} `json:"changes"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &h))
	require.Len(t, h.Changes, 2, "the newest two, oldest first")
	require.Equal(t, "update", h.Changes[0].Op)
	require.Equal(t, "delete", h.Changes[1].Op)
}

// TestEndpointsExportImportRoundTrip: the demo's endpoints, written as
// the configuration file's endpoints: section, imported into the table
// and exported again, are the same endpoints; so is an endpoint with
// every key, the table's own included; a second import changes nothing.
func TestEndpointsExportImportRoundTrip(t *testing.T) {
	t.Parallel()
	cfg, query := endpointsDB(t)
	ep := func(args ...string) (int, string, string) {
		return postbox(t, append(append([]string{"endpoints"}, args...), "--config", cfg)...)
	}
	demo := endpointsFile{Endpoints: map[string]exportedEndpoint{}}
	for name, e := range demoEndpoints("http://127.0.0.1:8081", "http://127.0.0.1:8082", "http://127.0.0.1:8083") {
		demo.Endpoints[name] = exportedEndpoint{EndpointConfig: e}
	}
	in, err := marshalEndpoints(demo)
	require.NoError(t, err)
	every := `  aff-9:
    url: "https://t.example/pb?click={payload.click_id}&payout={payload.payout|0}"
    method: GET
    timeout: 10s
    max_attempts: 8
    backoff_base: 1m0s
    backoff_cap: 2h0m0s
    failure_threshold: 3
    cooldown: 30s
    max_cooldown: 10m0s
    rate_limit: 100/m
    max_in_flight: 2
    headers: {X-Key: k}
    success: {status: [200], body_contains: "success=true"}
    retry_on: [409]
    ordered: true
    redact_path: [4]
    allow_row_url: false
    row_url_hosts: []
    enabled: false
    event_types: [conversion, deposit.*]
    filter: {brand: casino-de, tier: 2}
    secret: partner_x
    secret_version: 3
    previous_secret_until: 2026-12-08T10:00:00Z
  aff-10:
    body: '{"id": "{event_id}"}'
    redact_path: true
`
	src := filepath.Join(t.TempDir(), "endpoints.yaml")
	require.NoError(t, os.WriteFile(src, append(in, every...), 0o600))
	code, out, errOut := ep("import", src)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "imported 5 endpoints: 5 created, 0 changed, 0 unchanged")
	require.Equal(t, "5", query(`SELECT count(*)::text FROM postbox.endpoints`))

	dst := filepath.Join(t.TempDir(), "export.yaml")
	code, out, errOut = ep("export", dst)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "exported 5 endpoints to "+dst)
	read := func(path string) endpointsFile {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		f, ignored, err := readEndpointsFile(b)
		require.NoError(t, err)
		require.Empty(t, ignored)
		return f
	}
	require.Equal(t, read(src), read(dst))
	exportedText, err := os.ReadFile(dst)
	require.NoError(t, err)
	require.NotContains(t, string(exportedText), "null", "keys a row leaves NULL are left out")
	fi, err := os.Stat(dst)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "headers may hold credentials")

	code, out, errOut = ep("import", dst)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "imported 5 endpoints: 0 created, 0 changed, 5 unchanged")
	require.Equal(t, "5", query(`SELECT count(*)::text FROM postbox.endpoint_changes`), "no change logged")

	// A configuration file imports its endpoints: section; a changed key
	// is a change; the file's secrets are never written to the database.
	f := read(dst)
	shop := f.Endpoints["shop"]
	shop.URL = ptr("http://127.0.0.1:9999/hooks/orders")
	f.Endpoints["shop"] = shop
	b, err := marshalEndpoints(f)
	require.NoError(t, err)
	conf := filepath.Join(t.TempDir(), "postbox.yaml")
	require.NoError(t, os.WriteFile(conf, append([]byte("log_level: info\n"), b...), 0o600))
	code, out, errOut = ep("import", conf)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, errOut, "left as they are: log_level")
	require.Contains(t, out, "changed shop")
	require.Contains(t, out, "0 created, 1 changed, 4 unchanged")

	require.NoError(t, os.WriteFile(conf, []byte("endpoints:\n  shop:\n    url: https://x.example/\n    secrets: ["+outbox.NewSecret()+"]\n"), 0o600))
	code, _, errOut = ep("import", conf)
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "no secret is written into the database")
	require.NotContains(t, errOut, "whsec_")

	// Keys are checked as the file's are.
	require.NoError(t, os.WriteFile(conf, []byte("endpoints:\n  x:\n    url: https://x.example/\n    colour: blue\n"), 0o600))
	code, _, errOut = ep("import", conf)
	require.Equal(t, exitUsage, code)
	require.Regexp(t, `endpoints\.x: .*field colour not found`, errOut)

	// One transaction: an invalid endpoint imports none of them.
	require.NoError(t, os.WriteFile(conf, []byte("endpoints:\n  new-1:\n    url: https://x.example/\n  new-2:\n    url: \"https://x.example/{payload.x\"\n"), 0o600))
	code, _, errOut = ep("import", conf)
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "new-2 is invalid: url")
	require.Equal(t, "0", query(`SELECT count(*)::text FROM postbox.endpoints WHERE name LIKE 'new-%'`))

	// A row whose value does not parse is exported without it, and said.
	query(`INSERT INTO postbox.endpoints (name, url, rate_limit, timeout) VALUES ('odd', 'https://odd.example/', 'lots', '5 seconds') RETURNING name`)
	code, out, errOut = ep("export", "-")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, errOut, "warning: odd is invalid (rate_limit: ")
	require.Contains(t, errOut, "exported without rate_limit")
	f, _, err = readEndpointsFile([]byte(out))
	require.NoError(t, err)
	require.Nil(t, f.Endpoints["odd"].RateLimit)
	require.Equal(t, config.Duration(5*time.Second), *f.Endpoints["odd"].Timeout)
	require.Equal(t, "https://odd.example/", *f.Endpoints["odd"].URL)
	query(`DELETE FROM postbox.endpoints WHERE name = 'odd' RETURNING name`)

	// --file-keys writes what the configuration file takes: a file made of
	// it loads, and the table's own keys are named, not written.
	code, out, errOut = ep("export", "-", "--file-keys")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, errOut, "aff-9: left out enabled, event_types, filter, secret, secret_version, previous_secret_until")
	var probe map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(out), &probe))
	require.Contains(t, probe, "endpoints")
	conf = filepath.Join(t.TempDir(), "file.yaml")
	require.NoError(t, os.WriteFile(conf, []byte("signing:\n  secrets: ["+outbox.NewSecret()+"]\n"+out), 0o600))
	_, err = config.Load(conf, nil)
	require.NoError(t, err, "the export is an endpoints: section the configuration file takes")
}
