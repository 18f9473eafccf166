package config_test

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/macro"
)

func TestDefaultsNeedOnlyTheDatabaseURL(t *testing.T) {
	t.Parallel()
	env := map[string]string{config.EnvDatabaseURL: "postgres://relay@db/app"}
	cfg, err := config.Load("", func(k string) string { return env[k] })
	require.NoError(t, err)
	require.Equal(t, "postgres://relay@db/app", cfg.DatabaseURL)
	require.Equal(t, "postbox.outbox", cfg.Table.String())
	require.Equal(t, "postbox", cfg.Slot)
	require.Equal(t, "127.0.0.1:9187", cfg.AdminListen)
	require.False(t, cfg.AllowPrivateTargets, "the SSRF guard is on by default")
	require.Equal(t, time.Duration(0), cfg.OutboxRetention)
	require.Equal(t, 168*time.Hour, cfg.EventRetention)
	require.True(t, cfg.CPUBatch, "postbox's threads are batch by default")

	ep := cfg.Endpoint("anyone")
	require.False(t, ep.Configured)
	require.Equal(t, "POST", ep.Method)
	require.Equal(t, 15*time.Second, ep.Timeout)
	require.Equal(t, 5, ep.MaxAttempts)
	require.Equal(t, 30*time.Second, ep.BackoffBase)
	require.Equal(t, time.Hour, ep.BackoffCap)
	require.Equal(t, 10, ep.FailureThreshold)
	require.Equal(t, 5*time.Minute, ep.Cooldown)
	require.Equal(t, time.Hour, ep.MaxCooldown)
	require.Equal(t, 8, ep.MaxInFlight)
	require.True(t, ep.RateLimit.IsZero())
}

func TestSpecExampleParses(t *testing.T) {
	t.Parallel()
	secret := outbox.NewSecret()
	yaml := `
database_url: postgres://relay@db:5432/app?sslmode=verify-full
outbox_table: postbox.outbox
slot: postbox
publication: postbox
admin_listen: 127.0.0.1:9187
admin_token: ""
log_level: info
log_payloads: false
allow_private_targets: false
allowed_cidrs: []
outbox_retention: 0s
event_retention: 168h
delivery_retention: 168h
signing:
  secrets: ["` + secret + `"]
defaults:
  timeout: 15s
  max_attempts: 5
endpoints:
  partner-42:
    url: "https://track.example/postback?click_id={payload.click_id}&payout={payload.payout}"
    method: GET
    rate_limit: 100/m
    success: {status: [200], body_contains: "success=true"}
  billing:
    url: https://billing.example/hooks
    timeout: 5s
    max_in_flight: 2
    retry_on: [404]
    ordered: true
    headers: {X-Team: payments}
`
	cfg, err := config.Parse([]byte(yaml))
	require.NoError(t, err)
	p := cfg.Endpoint("partner-42")
	require.True(t, p.Configured)
	require.Equal(t, "GET", p.Method)
	require.Equal(t, config.Rate{N: 100, Per: time.Minute}, p.RateLimit)
	require.Equal(t, []int{200}, p.Success.Status)
	require.Equal(t, "success=true", p.Success.BodyContains)
	require.Len(t, p.Secrets, 1)
	b := cfg.Endpoint("billing")
	require.Equal(t, 5*time.Second, b.Timeout)
	require.Equal(t, 2, b.MaxInFlight)
	require.Equal(t, 5, b.MaxAttempts, "inherited from defaults")
	require.Equal(t, []int{404}, b.RetryOn)
	require.True(t, b.Ordered)
	require.Equal(t, "payments", b.Headers["X-Team"])
	require.Equal(t, "POST", b.Method)
}

func TestErrorsNameTheKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		yaml string
		key  string
	}{
		{"bogus: 1", "bogus"},
		{"defaults:\n  timout: 5s", "defaults.timout"},
		{"endpoints:\n  p:\n    url: https://x.example\n    colour: red", "endpoints.p.colour"},
		{"event_retention: a week", "event_retention"},
		{"defaults:\n  timeout: 5 minutes", "defaults.timeout"},
		{"endpoints:\n  p:\n    url: https://x.example\n    rate_limit: fast", "endpoints.p.rate_limit"},
		{"endpoints:\n  p:\n    url: https://x.example\n    rate_limit: 10/fortnight", "endpoints.p.rate_limit"},
		{"endpoints:\n  p:\n    url: ftp://x.example", "endpoints.p.url"},
		{"endpoints:\n  p:\n    url: https://x.example\n    max_attempts: 0", "endpoints.p.max_attempts"},
		{"endpoints:\n  p:\n    url: https://x.example\n    max_in_flight: many", "endpoints.p.max_in_flight"},
		{"endpoints:\n  p:\n    url: https://x.example\n    method: DELETE", "endpoints.p.method"},
		{"endpoints:\n  p:\n    url: https://x.example\n    success: {status: [999]}", "endpoints.p.success.status[0]"},
		{"endpoints:\n  p:\n    url: https://x.example\n    success: {body_contains: ok, body_mismatch: drop}", "endpoints.p.success.body_mismatch"},
		{"report_sum: [payout, payout]", "report_sum[1]"},
		{"report_sum: [\"a.b\"]", "report_sum[0]"},
		{"report_retention: 1h", "report_retention"},
		{"log_level: loud", "log_level"},
		{"slot: Bad-Name", "slot"},
		{"publication: \"x; drop\"", "publication"},
		{"outbox_table: app.Outbox", "outbox_table"},
		{"admin_listen: 0.0.0.0:9187", "admin_token"},
		{"allowed_cidrs: [10.0.0.0]", "allowed_cidrs[0]"},
		{"signing:\n  secrets: [not-a-secret!]", "signing.secrets[0]"},
		{"defaults:\n  backoff_base: 2h\n  backoff_cap: 1h", "defaults.backoff_base"},
		{"max_body: huge", "max_body"},
		{"max_body: 9999999999999GiB", "max_body"},
		{"allow_private_targets: maybe", "allow_private_targets"},
		{"signing:\n  per_endpoint: per-partner", "signing.per_endpoint"},
		{"signing:\n  secrets: [whsec_c2hvcnQta2V5LW9mLTE5Ynl0ZXM=]", "signing.secrets[0]"}, // 20 bytes
		{"admin_token: short", "admin_token"},
		{"walsender_nice: -21", "walsender_nice"},
		{"walsender_nice: high", "walsender_nice"},
		{"cpu_scheduling: idle", "cpu_scheduling"},
		{"admin_token_on_loopback: true", "admin_token_on_loopback"},
		{"admin_tls_cert: cert.pem", "admin_tls_cert"},
		{"admin_tls_key: key.pem", "admin_tls_cert"},
		{"endpoints:\n  p:\n    url: https://x.example\n  p:\n    url: https://y.example", "endpoints.p"},
	} {
		_, err := config.Parse([]byte(tc.yaml))
		require.Error(t, err, tc.yaml)
		var ce *config.Error
		require.True(t, errors.As(err, &ce), "%s: %v", tc.yaml, err)
		require.Equal(t, tc.key, ce.Key, "%s: %v", tc.yaml, err)
		require.Contains(t, err.Error(), tc.key)
	}
}

func TestSecretsNeverInErrors(t *testing.T) {
	t.Parallel()
	_, err := config.Parse([]byte("signing:\n  secrets: [whsec_%%%supersecretvalue%%%]"))
	require.Error(t, err)
	require.NotContains(t, err.Error(), "supersecretvalue")

	// A secret pasted where it does not belong is not repeated either.
	secret := "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	for _, doc := range []string{
		"slot: " + secret,
		"log_level: " + secret,
		"defaults:\n  timeout: " + secret,
		"defaults:\n  rate_limit: " + secret,
		"defaults:\n  max_attempts: " + secret,
		"signing:\n  " + secret + ": 1",
		"signing:\n  secrets_file: " + secret,
		"endpoints:\n  p:\n    headers: {\"" + secret + ":\": x}",
		"*" + secret, // an alias the YAML parser cannot resolve
	} {
		_, err := config.Parse([]byte(doc))
		var ce *config.Error
		require.ErrorAs(t, err, &ce, doc)
		require.NotContains(t, err.Error(), secret[:12], doc)
		require.Contains(t, err.Error(), "whsec_[redacted]", doc)
	}
}

func TestEnvironmentOverridesTheFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "postbox.yaml")
	require.NoError(t, os.WriteFile(path, []byte("database_url: postgres://file@db/app\nlog_level: warn\n"), 0o600))
	s1, s2 := outbox.NewSecret(), outbox.NewSecret()
	env := map[string]string{
		config.EnvDatabaseURL:         "postgres://env@db/app",
		config.EnvLogLevel:            "debug",
		config.EnvAllowPrivateTargets: "true",
		config.EnvAdminListen:         "0.0.0.0:9999",
		config.EnvAdminToken:          "t0ken-of-enough-length",
		config.EnvSigningSecrets:      s1 + "," + s2,
	}
	cfg, err := config.Load(path, func(k string) string { return env[k] })
	require.NoError(t, err)
	require.Equal(t, "postgres://env@db/app", cfg.DatabaseURL)
	require.Equal(t, "debug", cfg.LogLevel)
	require.True(t, cfg.AllowPrivateTargets)
	require.Equal(t, "0.0.0.0:9999", cfg.AdminListen)
	require.Equal(t, "t0ken-of-enough-length", cfg.AdminToken, "off loopback with the token from the environment")
	require.Len(t, cfg.Secrets, 2)

	env[config.EnvAllowPrivateTargets] = "perhaps"
	_, err = config.Load(path, func(k string) string { return env[k] })
	var ce *config.Error
	require.ErrorAs(t, err, &ce)
	require.Equal(t, config.EnvAllowPrivateTargets, ce.Key)
}

func TestRatesAndSizes(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]config.Rate{
		"100/m": {100, time.Minute}, "10/s": {10, time.Second}, "1000/h": {1000, time.Hour},
		"5/10s": {5, 10 * time.Second}, "60/min": {60, time.Minute},
	} {
		got, err := config.ParseRate(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	r, _ := config.ParseRate("100/m")
	require.InDelta(t, 100.0/60, r.PerSecond(), 1e-9)
	for _, bad := range []string{"", "100", "0/s", "-1/s", "x/s", "10/y"} {
		_, err := config.ParseRate(bad)
		require.Error(t, err, bad)
	}
	for in, want := range map[string]int64{"1MiB": 1 << 20, "512KiB": 512 << 10, "1048576": 1 << 20, "2MB": 2000000} {
		got, err := config.ParseByteSize(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
}

func TestTemplatesDefaultToGet(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse([]byte("endpoints:\n  aff:\n    url: https://t.example/pb?cid={payload.click_id}\n"))
	require.NoError(t, err)
	require.Equal(t, "GET", cfg.Endpoint("aff").Method)
	require.True(t, strings.Contains(cfg.Endpoint("aff").URL, "{payload.click_id}"))
}

// TestSampleConfigs loads testdata/config: the samples parse, and each
// invalid one fails naming the key its first line promises.
func TestSampleConfigs(t *testing.T) {
	t.Parallel()
	samples, _ := filepath.Glob("../../testdata/config/*.yaml")
	require.NotEmpty(t, samples)
	for _, f := range samples {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		_, err = config.Parse(data)
		require.NoError(t, err, f)
	}
	invalid, _ := filepath.Glob("../../testdata/config/invalid/*.yaml")
	require.NotEmpty(t, invalid)
	for _, f := range invalid {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		first, _, _ := strings.Cut(string(data), "\n")
		want := strings.TrimSpace(strings.TrimPrefix(first, "# error:"))
		_, err = config.Parse(data)
		var ce *config.Error
		require.ErrorAs(t, err, &ce, f)
		require.Equal(t, want, ce.Key, "%s: %v", f, err)
	}
}

func TestAffiliateExampleConfig(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../examples/affiliate/postbox.yaml")
	require.NoError(t, err)
	secrets := filepath.Join(t.TempDir(), "signing")
	require.NoError(t, os.WriteFile(secrets, []byte(outbox.NewSecret()+"\n"), 0o600))
	cfg, err := config.Parse([]byte(strings.ReplaceAll(string(data), "/var/run/secrets/postbox/signing", secrets)))
	require.NoError(t, err)
	ep := cfg.Endpoint("acme-network")
	require.Equal(t, "GET", ep.Method)
	require.True(t, macro.Contains(ep.URL), "a template")
	require.Len(t, cfg.Secrets, 1)
	require.Equal(t, []string{secrets}, cfg.SecretFiles)
}

// TestSidecarExampleConfig loads the configuration in the Kubernetes
// example's ConfigMap as its pod would: the database URL and the admin
// token from the environment, the signing secrets from the mounted file.
func TestSidecarExampleConfig(t *testing.T) {
	t.Parallel()
	f, err := os.Open("../../examples/sidecar/kubernetes.yaml")
	require.NoError(t, err)
	defer f.Close()
	var body string
	dec := yaml.NewDecoder(f)
	for {
		var doc struct {
			Kind string            `yaml:"kind"`
			Data map[string]string `yaml:"data"`
		}
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		if doc.Kind == "ConfigMap" {
			body = doc.Data["postbox.yaml"]
		}
	}
	require.NotEmpty(t, body, "the ConfigMap carries postbox.yaml")
	dir := t.TempDir()
	secrets := filepath.Join(dir, "signing")
	require.NoError(t, os.WriteFile(secrets, []byte(outbox.NewSecret()+"\n"+outbox.NewSecret()+"\n"), 0o600))
	path := filepath.Join(dir, "postbox.yaml")
	require.NoError(t, os.WriteFile(path, []byte(strings.ReplaceAll(body, "/var/run/secrets/postbox/signing", secrets)), 0o600))
	env := map[string]string{config.EnvDatabaseURL: "postgres://postbox_relay@db/app"}
	_, err = config.Load(path, func(k string) string { return env[k] })
	var ce *config.Error
	require.ErrorAs(t, err, &ce, "off loopback without a token is refused")
	require.Equal(t, "admin_token", ce.Key)
	env[config.EnvAdminToken] = "from-the-kubernetes-secret"
	cfg, err := config.Load(path, func(k string) string { return env[k] })
	require.NoError(t, err)
	require.Len(t, cfg.Secrets, 2, "both keys of a rotation sign")
	require.Equal(t, "GET", cfg.Endpoint("acme-network").Method)
	require.True(t, cfg.Endpoint("billing").Ordered)
	require.False(t, cfg.Migrate, "the relay's role has no DDL rights: the Job migrates")
}

// The file is what was written; validating it reads nothing, resolving it
// reads the secrets files and gives typed settings.
func TestValidateIsPureResolveReads(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "not-yet-mounted")
	f := config.Default()
	f.DatabaseURL = "postgres://relay@db/app"
	f.Signing.SecretsFile = missing
	f.ShutdownGrace = config.Duration(7 * time.Second)
	require.NoError(t, f.Validate(), "validation does not read the secrets file")
	_, err := f.Resolve()
	var ce *config.Error
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "signing.secrets_file", ce.Key)

	require.NoError(t, os.WriteFile(missing, []byte(outbox.NewSecret()+"\n"), 0o600))
	cfg, err := f.Resolve()
	require.NoError(t, err)
	require.Len(t, cfg.Secrets, 1)
	require.Equal(t, []string{missing}, cfg.SecretFiles)
	require.Equal(t, 7*time.Second, cfg.ShutdownGrace)
	require.Equal(t, config.StatusIntervalDefault, cfg.StatusInterval)
	require.Equal(t, *f, cfg.File, "the resolved configuration keeps what it came from")

	f.Lease = config.Duration(time.Millisecond)
	err = f.Validate()
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "lease", ce.Key, "validation still names the key")
}

// With signing.per_endpoint: derived, every endpoint without secrets of its
// own signs with its own derived secret, one per master (a rotation lists
// both); configured, unknown and row-named endpoints alike.
func TestDerivedEndpointSecrets(t *testing.T) {
	t.Parallel()
	current, previous := outbox.NewSecret(), outbox.NewSecret()
	own := outbox.NewSecret()
	cfg, err := config.Parse([]byte("database_url: postgres://x@localhost/db\nsigning:\n  secrets: [" + current + ", " + previous + "]\n" +
		"  per_endpoint: derived\nendpoints:\n  a:\n    url: https://a.example\n  b:\n    url: https://b.example\n    secrets: [" + own + "]\n"))
	require.NoError(t, err)
	reveal := func(ss []outbox.Secret) []string {
		var out []string
		for _, s := range ss {
			out = append(out, s.Reveal())
		}
		return out
	}
	masters := make([]outbox.Secret, 2)
	for i, m := range []string{current, previous} {
		masters[i], err = outbox.ParseSecret(m)
		require.NoError(t, err)
	}
	want := func(name string) []string {
		return []string{outbox.DeriveSecret(masters[0], name).Reveal(), outbox.DeriveSecret(masters[1], name).Reveal()}
	}
	require.Equal(t, want("a"), reveal(cfg.SigningSecrets(cfg.Endpoint("a"))))
	require.Equal(t, want("from-a-row"), reveal(cfg.SigningSecrets(cfg.Endpoint("from-a-row"))))
	require.Equal(t, []string{own}, reveal(cfg.SigningSecrets(cfg.Endpoint("b"))), "an endpoint's own secrets override the derived one")
	require.NotEqual(t, reveal(cfg.SigningSecrets(cfg.Endpoint("a"))), reveal(cfg.Endpoint("c").Secrets))

	shared, err := config.Parse([]byte("database_url: postgres://x@localhost/db\nsigning:\n  secrets: [" + current + "]\n"))
	require.NoError(t, err)
	require.Equal(t, []string{current}, reveal(shared.Endpoint("a").Secrets), "shared by default")
}

// TestLanes: a row's own URL gets a lane of its host under the endpoint,
// without the URL's user info; a configured URL, an ordered endpoint or an
// unparsable URL keeps the endpoint's lane; NameOf inverts Lane.
func TestLanes(t *testing.T) {
	t.Parallel()
	u, yes := "https://hooks.example.com/x", true
	f := config.Default()
	f.DatabaseURL = "postgres://localhost/x"
	f.Endpoints = map[string]config.EndpointConfig{
		"fixed":    {URL: &u},
		"open":     {URL: &u, AllowRowURL: &yes},
		"ordered":  {Ordered: &yes},
		"settings": {},
	}
	cfg, err := f.Resolve()
	require.NoError(t, err)
	for _, c := range []struct{ name, url, lane string }{
		{"settings", "", "settings"},
		{"settings", "https://user:pw@PB.Example.com:8443/pb?click_id=1", "settings → pb.example.com:8443"},
		{"unknown", "http://a.test/pb", "unknown → a.test"},
		{"open", "http://b.test/", "open → b.test"},
		{"fixed", "http://b.test/", "fixed"},
		{"ordered", "http://b.test/", "ordered"},
		{"settings", "::not a url", "settings"},
	} {
		lane := cfg.Lane(c.name, c.url)
		require.Equal(t, c.lane, lane, "%s %s", c.name, c.url)
		require.Equal(t, c.name, cfg.NameOf(lane))
	}
}

// row_url_hosts takes host names (a leading *. for the names below one of
// two labels at least) and IP addresses, compared in lower case; a port,
// a URL or a wildcard over a top-level name is refused with the entry's
// key. allow_row_url under defaults is for endpoints not configured;
// row_url_hosts, which only narrows, is inherited as other keys are.
func TestRowURLHosts(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"pb.example.com:443", "https://pb.example.com", "pb.example.com/x", "*.com", "*", "",
		"pb example.com", "bücher.example", "*.*.example.com", "a..example.com", "fe80::1%eth0"} {
		f := config.Default()
		f.Endpoints = map[string]config.EndpointConfig{"p": {RowURLHosts: []string{"ok.example", bad}}}
		err := f.Validate()
		var ce *config.Error
		require.True(t, errors.As(err, &ce), "%q: %v", bad, err)
		require.Equal(t, "endpoints.p.row_url_hosts[1]", ce.Key, "%q", bad)
		f = config.Default()
		f.Defaults.RowURLHosts = []string{bad}
		require.True(t, errors.As(f.Validate(), &ce), "%q", bad)
		require.Equal(t, "defaults.row_url_hosts[0]", ce.Key)
	}

	yes := true
	f := config.Default()
	f.Defaults.AllowRowURL = &yes
	f.Defaults.RowURLHosts = []string{"PB.Example.com.", "*.Track.example", "203.0.113.7", "[2001:DB8::1]", "*.0.113.7"}
	u := "https://partner.example/hook"
	f.Endpoints = map[string]config.EndpointConfig{
		"settings": {},
		"own":      {AllowRowURL: &yes, RowURLHosts: []string{}},
		"fixed":    {URL: &u},
	}
	cfg, err := f.Resolve()
	require.NoError(t, err)
	def := cfg.Endpoint("not-configured")
	require.True(t, def.AllowRowURL)
	require.Equal(t, []string{"pb.example.com", "*.track.example", "203.0.113.7", "2001:db8::1", "*.0.113.7"}, def.RowURLHosts)
	for host, ok := range map[string]bool{
		"pb.example.com": true, "PB.EXAMPLE.COM.": true, "a.track.example": true, "a.b.track.example": true,
		"203.0.113.7": true, "2001:db8:0::1": true,
		"track.example": false, "xtrack.example": false, "pb.example.com.evil.example": false, "evil.example": false,
		"example.com": false, "203.0.113.8": false, "1.0.113.7": false, "": false,
	} {
		require.Equal(t, ok, def.RowURLHost(host), host)
	}
	settings := cfg.Endpoint("settings")
	require.False(t, settings.AllowRowURL, "a configured endpoint allows row urls only itself")
	require.Equal(t, def.RowURLHosts, settings.RowURLHosts, "the list, which only narrows, is inherited")
	own := cfg.Endpoint("own")
	require.True(t, own.AllowRowURL)
	require.True(t, own.RowURLHost("anywhere.example"), "an empty list of its own lifts the inherited one")
	require.False(t, cfg.Endpoint("fixed").AllowRowURL)
	require.Equal(t, "fixed", cfg.Lane("fixed", "https://pb.example.com/x"), "refused: the endpoint's own lane, as before")
	require.Equal(t, "zzz → pb.example.com", cfg.Lane("zzz", "https://pb.example.com/x"))
}

func TestRedactPath(t *testing.T) {
	t.Parallel()
	for yaml, want := range map[string]string{
		"true":   "/***/***/",
		"false":  "/a/b/",
		"[2]":    "/a/***/",
		"[1, 9]": "/***/b/",
	} {
		cfg, err := config.Parse([]byte("defaults:\n  redact_path: " + yaml + "\n"))
		require.NoError(t, err, yaml)
		require.Equal(t, want, cfg.Defaults.RedactPath.Redacted("/a/b/"), yaml)
	}
	for _, bad := range []string{"[0]", "[64]", "maybe", "{a: 1}"} {
		_, err := config.Parse([]byte("endpoints:\n  p:\n    url: https://p.example\n    redact_path: " + bad + "\n"))
		var ce *config.Error
		require.True(t, errors.As(err, &ce), bad)
		require.Equal(t, "endpoints.p.redact_path", ce.Key, bad)
	}
}
