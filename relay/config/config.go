package config

import (
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/macro"
)

// Config is the resolved configuration a relay runs on: defaults applied,
// secrets read, endpoints resolved against the defaults. Make one with
// Load, Parse or File.Resolve; treat it as read-only.
type Config struct {
	// File is what this configuration was resolved from (a secrets file
	// rotated in place is picked up by resolving it again).
	File File

	DatabaseURL string
	Table       outbox.Table
	Slot        string
	Publication string
	AdminListen string
	AdminToken  string
	LogLevel    string
	LogPayloads bool
	// AllowPrivateTargets and AllowedCIDRs are what the SSRF guard opens
	// (allow_private_targets, allowed_cidrs, each entry masked); the guard
	// itself is built from the configuration in force at each check.
	AllowPrivateTargets bool
	AllowedCIDRs        []netip.Prefix
	OutboxRetention     time.Duration
	EventRetention      time.Duration
	DeliveryRetention   time.Duration
	AttemptRetention    time.Duration
	// Messages: events written with outbox.Emit (logical decoding
	// messages) are delivered (outbox_messages). Off by default: any role
	// that may run pg_logical_emit_message (PUBLIC, unless revoked) could
	// write one, so off, each becomes a messages_off dead letter.
	// MessageRoles (outbox_message_roles) are the roles that may emit, with
	// their members; postbox doctor fails while another can.
	Messages     bool
	MessageRoles []string
	// SearchKeys are the payload fields extracted and indexed at ingest.
	SearchKeys []string
	// ReportRetention and ReportSum: as File's.
	ReportRetention time.Duration
	ReportSum       []string
	MaxBody         int64
	ShutdownGrace   time.Duration
	Lease           time.Duration
	SweepInterval   time.Duration
	StatusInterval  time.Duration
	StallTimeout    time.Duration
	WalsenderNice   int
	// CPUBatch: postbox's threads are scheduled as SCHED_BATCH
	// (cpu_scheduling: batch).
	CPUBatch       bool
	LeaderLease    time.Duration
	MaxConcurrency int
	// AdminTokenOnLoopback, AdminTLSCert and AdminTLSKey: as File's.
	AdminTokenOnLoopback      bool
	AdminTLSCert, AdminTLSKey string
	// MetricsEndpointLabels caps the endpoint label of metrics.
	MetricsEndpointLabels int
	Alerts                Alerts
	// Secrets are the global signing secrets, newest first.
	Secrets []outbox.Secret
	// Derived: endpoints without secrets of their own sign with secrets
	// derived from the defaults' (signing.per_endpoint: derived).
	Derived bool
	// SecretFiles are the secrets files read, to watch for rotations.
	SecretFiles []string
	// Defaults are the settings of an endpoint that is not configured.
	Defaults Endpoint
	// Endpoints are the configured endpoints' effective settings.
	Endpoints map[string]Endpoint
	// EndpointTable is the endpoints of postbox.endpoints as applied on
	// this instance (nil: none); the relay sets it on every configuration
	// it loads, and a name the file defines too is the file's (Conflicts).
	EndpointTable *EndpointTable
	// NamedSecrets are the secrets declared by name (signing.named), which
	// a table endpoint may name (its secret column).
	NamedSecrets map[string][]outbox.Secret

	// Migrate: run migrates at start (migrate:); otherwise it checks.
	Migrate bool

	// PortalListen and Portal: the partner portal's (see File's).
	PortalListen string
	Portal       Portal
}

// Portal is the partner portal's settings, resolved.
type Portal struct {
	PublicURL                             string
	ShowSecret, AllowReplay, ShowResponse bool
	// Key signs links and sessions: portal.key, else derived from the
	// newest signing secret; nil when neither is set (no links).
	Key []byte
	// KeyDerived: Key comes from the signing secret, so rotating it away
	// ends every link.
	KeyDerived bool
}

// Alerts are the thresholds at which postbox's alerts fire.
type Alerts struct {
	DeadLettersPerHour int
	OldestPending      time.Duration
	EndpointP95        time.Duration
	SlotLag            int64
}

// Endpoint is an endpoint's effective settings.
type Endpoint struct {
	Name             string
	Configured       bool
	URL              string
	Method           string
	Timeout          time.Duration
	MaxAttempts      int
	BackoffBase      time.Duration
	BackoffCap       time.Duration
	FailureThreshold int
	Cooldown         time.Duration
	MaxCooldown      time.Duration
	RateLimit        Rate
	MaxInFlight      int
	// Secrets are the endpoint's own or the shared secrets, as configured;
	// Config.SigningSecrets gives those its requests are signed with.
	Secrets []outbox.Secret
	// OwnSecrets: Secrets were set for this endpoint itself, not inherited.
	OwnSecrets bool
	Headers    map[string]string
	// Body is the body template as written (nil: the payload is the
	// body); the URL and body are validated here and compiled where used,
	// so that an Endpoint is data a reload or a table can replace whole.
	Body    *string
	Success Success
	RetryOn []int
	Ordered bool
	// RedactPath: the URL path segments attempts record as ***.
	RedactPath RedactPath
	// AllowRowURL: rows may give their own url although the endpoint has
	// one, or has headers (see EndpointConfig.AllowRowURL).
	AllowRowURL bool
	// RowURLHosts are the hosts a row's url may name, lower-case (any
	// when empty; see RowURLHost).
	RowURLHosts []string

	// Source is where the settings come from: SourceFile, SourceTable or
	// SourceDefaults.
	Source string
	// Of a table endpoint: Disabled holds its events like a pause;
	// Invalid (why its row cannot be used) holds them until a corrected
	// row arrives; Revision is the row's, recorded with each attempt;
	// SecretVersion and PreviousSecretUntil choose its derived secrets.
	Disabled            bool
	Invalid             string
	Revision            int64
	SecretVersion       int
	PreviousSecretUntil time.Time
}

// Held reports why ep's events wait rather than being attempted ("" when
// they do not): a table endpoint disabled, or whose row is invalid.
func (ep Endpoint) Held() string {
	switch {
	case ep.Invalid != "":
		return "invalid: " + ep.Invalid
	case ep.Disabled:
		return "disabled"
	}
	return ""
}

// Endpoint returns the effective settings for the named endpoint: its own
// when configured (in the file, or else in the table), the defaults
// otherwise (Configured false, URL empty).
func (c *Config) Endpoint(name string) Endpoint {
	if ep, ok := c.Endpoints[name]; ok {
		return ep
	}
	if ep, ok := c.tableEndpoint(name); ok {
		return ep
	}
	ep := c.Defaults
	ep.Name = name
	return ep
}

// LaneSep joins an endpoint's name and a row URL's host in a lane key.
const LaneSep = " → "

// Lane is the key a delivery of endpoint name to rowURL is queued and
// protected under: its in-flight lane, circuit breaker, pause and rate
// limit. For a request to the endpoint's own URL it is the name; for one
// to the row's own URL, the name and that URL's host and port
// ("partners → pb.example.com:8443"), so that one partner's hanging or
// failing host holds back only its own deliveries, not another partner's
// under the same endpoint. An ordered endpoint keeps one lane: its order
// is the endpoint's. A row URL refused for the endpoint's headers or its
// row_url_hosts keeps its host's lane, which a replay once it is allowed
// goes to. A URL's user info never reaches a key, which is shown and
// logged.
func (c *Config) Lane(name, rowURL string) string {
	if rowURL == "" {
		return name
	}
	if ep := c.Endpoint(name); ep.Ordered || ep.URL != "" && !ep.AllowRowURL {
		return name
	}
	u, err := url.Parse(rowURL)
	if err != nil || u.Host == "" {
		return name
	}
	return name + LaneSep + strings.ToLower(u.Host)
}

// NameOf is the endpoint a lane key belongs to (see Lane).
func (c *Config) NameOf(lane string) string {
	if _, ok := c.Endpoints[lane]; ok {
		return lane
	}
	if c.EndpointTable.Has(lane) {
		return lane
	}
	if i := strings.LastIndex(lane, LaneSep); i >= 0 {
		return lane[:i]
	}
	return lane
}

// SigningSecrets are the secrets ep's deliveries are signed with: its own,
// or with signing.per_endpoint: derived those derived for its name from
// each master, or the shared ones. They are derived here, where a request
// is signed, so that looking up an endpoint's settings costs no HMAC.
func (c *Config) SigningSecrets(ep Endpoint) []outbox.Secret {
	if ep.Source == SourceTable && !ep.OwnSecrets {
		// A table endpoint always signs with its derived secret.
		return tableSecrets(ep, time.Now())
	}
	if c.Derived && !ep.OwnSecrets {
		return DeriveSecrets(ep.Secrets, ep.Name)
	}
	return ep.Secrets
}

// DeriveSecrets is endpoint's secret under each of masters, in their order
// (so a rotation lists both).
func DeriveSecrets(masters []outbox.Secret, endpoint string) []outbox.Secret {
	out := make([]outbox.Secret, len(masters))
	for i, m := range masters {
		out[i] = outbox.DeriveSecret(m, endpoint)
	}
	return out
}

// secretsReader reads a secrets file: readSecretsFile when resolving, a
// reader that reads nothing when only validating.
type secretsReader func(key, path string) ([]outbox.Secret, error)

func skipSecretsFile(string, string) ([]outbox.Secret, error) { return nil, nil }

// Validate checks every setting without reading anything (secrets files
// are read by Resolve), naming the offending key.
func (f *File) Validate() error {
	_, err := f.resolve(skipSecretsFile)
	return err
}

// Resolve reads the secrets files, validates, and returns the resolved
// configuration.
func (f *File) Resolve() (*Config, error) { return f.resolve(readSecretsFile) }

var (
	nameRe      = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
	searchKeyRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	macroRe     = regexp.MustCompile(`\{[^{}]*\}`)
	logLevels   = map[string]bool{"debug": true, "info": true, "warn": true, "error": true}
	methods     = map[string]bool{"GET": true, "POST": true, "PUT": true, "PATCH": true}
)

func (c *File) resolve(readFile secretsReader) (*Config, error) {
	if c.DatabaseURL == "" {
		// Not an error here: commands that need the database say so.
	} else if _, err := url.Parse(c.DatabaseURL); err != nil && !strings.Contains(c.DatabaseURL, "=") {
		return nil, keyErr("database_url", "not a URL or key=value connection string")
	}
	t, err := outbox.ParseTable(c.OutboxTable)
	if err != nil {
		return nil, keyErr("outbox_table", "%v", err)
	}
	out := &Config{
		File: *c, DatabaseURL: c.DatabaseURL, Table: t, Slot: c.Slot, Publication: c.Publication,
		AdminListen: c.AdminListen, AdminToken: c.AdminToken, LogLevel: c.LogLevel, LogPayloads: c.LogPayloads,
		OutboxRetention: c.OutboxRetention.D(), EventRetention: c.EventRetention.D(), DeliveryRetention: c.DeliveryRetention.D(),
		AttemptRetention: c.AttemptRetention.D(), SearchKeys: c.SearchKeys, ReportRetention: c.ReportRetention.D(), ReportSum: c.ReportSum, Messages: c.OutboxMessages, MessageRoles: c.OutboxMessageRoles,
		MaxBody: int64(c.MaxBody), ShutdownGrace: c.ShutdownGrace.D(), Lease: c.Lease.D(), SweepInterval: c.SweepInterval.D(),
		StatusInterval: c.StatusInterval.D(), StallTimeout: c.StallTimeout.D(), WalsenderNice: c.WalsenderNice, CPUBatch: c.CPUScheduling == "batch", LeaderLease: c.LeaderLease.D(), Migrate: c.Migrate,
		MaxConcurrency: c.MaxConcurrency, MetricsEndpointLabels: c.MetricsEndpointLabels,
		Alerts:      c.Alerts.resolve(),
		SecretFiles: c.secretFiles(),
	}
	if !nameRe.MatchString(c.Slot) {
		return nil, keyErr("slot", "%q is not a valid replication slot name (lower-case letters, digits and underscores, at most 63)", c.Slot)
	}
	if !nameRe.MatchString(c.Publication) {
		return nil, keyErr("publication", "%q is not a valid publication name (lower-case letters, digits and underscores, at most 63)", c.Publication)
	}
	if !logLevels[c.LogLevel] {
		return nil, keyErr("log_level", "%q is not one of debug, info, warn, error", c.LogLevel)
	}
	host, _, err := net.SplitHostPort(c.AdminListen)
	if c.AdminListen != "" && err != nil {
		return nil, keyErr("admin_listen", "%q is not host:port", c.AdminListen)
	}
	if c.AdminToken != "" && len(c.AdminToken) < MinAdminTokenLen {
		return nil, keyErr("admin_token", "too short to guard the admin listener: at least %d characters (`postbox secret new` makes a good one)", MinAdminTokenLen)
	}
	if c.AdminListen != "" && !isLoopback(host) && c.AdminToken == "" {
		return nil, keyErr("admin_token", "required when admin_listen (%s) is not a loopback address", c.AdminListen)
	}
	if c.AdminTokenOnLoopback && c.AdminToken == "" {
		return nil, keyErr("admin_token_on_loopback", "needs admin_token (or %s): it is the token asked for", EnvAdminToken)
	}
	out.AdminTokenOnLoopback = c.AdminTokenOnLoopback
	if (c.AdminTLSCert == "") != (c.AdminTLSKey == "") {
		return nil, keyErr("admin_tls_cert", "admin_tls_cert and admin_tls_key go together: set both or neither")
	}
	out.AdminTLSCert, out.AdminTLSKey = c.AdminTLSCert, c.AdminTLSKey
	out.AllowPrivateTargets = c.AllowPrivateTargets
	for i, cidr := range c.AllowedCIDRs {
		p, err := netip.ParsePrefix(cidr)
		if err != nil {
			return nil, keyErr(fmt.Sprintf("allowed_cidrs[%d]", i), "%q is not a CIDR such as 10.1.0.0/16", cidr)
		}
		out.AllowedCIDRs = append(out.AllowedCIDRs, p.Masked())
	}
	for i, r := range c.OutboxMessageRoles {
		if r == "" || slices.Contains(c.OutboxMessageRoles[:i], r) {
			return nil, keyErr(fmt.Sprintf("outbox_message_roles[%d]", i), "%q is empty or listed twice", r)
		}
	}
	seen := map[string]bool{}
	for i, k := range c.SearchKeys {
		if !searchKeyRe.MatchString(k) {
			return nil, keyErr(fmt.Sprintf("search_keys[%d]", i), "%q is not a top-level payload field name (letters, digits, _ and -, at most 64)", k)
		}
		if seen[k] {
			return nil, keyErr(fmt.Sprintf("search_keys[%d]", i), "%q is listed twice", k)
		}
		seen[k] = true
	}
	clear(seen)
	for i, k := range c.ReportSum {
		if !searchKeyRe.MatchString(k) {
			return nil, keyErr(fmt.Sprintf("report_sum[%d]", i), "%q is not a top-level payload field name (letters, digits, _ and -, at most 64)", k)
		}
		if seen[k] {
			return nil, keyErr(fmt.Sprintf("report_sum[%d]", i), "%q is listed twice", k)
		}
		seen[k] = true
	}
	if c.ReportRetention.D() < 24*time.Hour {
		return nil, keyErr("report_retention", "must be at least 24h: the rollups are read by the day")
	}
	if c.MaxBody <= 0 {
		return nil, keyErr("max_body", "must be positive")
	}
	if c.Lease.D() < time.Second {
		return nil, keyErr("lease", "must be at least 1s")
	}
	if c.SweepInterval.D() <= 0 {
		return nil, keyErr("sweep_interval", "must be positive")
	}
	if c.StatusInterval.D() <= 0 {
		return nil, keyErr("status_interval", "must be positive")
	}
	if c.StallTimeout.D() <= c.StatusInterval.D() {
		return nil, keyErr("stall_timeout", "must be longer than status_interval (%s)", c.StatusInterval.D())
	}
	if c.WalsenderNice < -20 || c.WalsenderNice > 19 {
		return nil, keyErr("walsender_nice", "%d is not a nice value: -20 to 19, 0 to leave the walsender as it is", c.WalsenderNice)
	}
	if c.CPUScheduling != "batch" && c.CPUScheduling != "normal" {
		return nil, keyErr("cpu_scheduling", "%q is not a policy: batch or normal", c.CPUScheduling)
	}
	if c.LeaderLease.D() < 300*time.Millisecond {
		return nil, keyErr("leader_lease", "must be at least 300ms")
	}
	if c.MaxConcurrency < 1 {
		return nil, keyErr("max_concurrency", "must be at least 1")
	}
	if c.MetricsEndpointLabels < 0 {
		return nil, keyErr("metrics_endpoint_labels", "must not be negative")
	}
	if c.Alerts.DeadLettersPerHour < 1 {
		return nil, keyErr("alerts.dead_letters_per_hour", "must be at least 1")
	}
	if c.Alerts.OldestPending.D() <= 0 {
		return nil, keyErr("alerts.oldest_pending", "must be positive")
	}
	if c.Alerts.EndpointP95.D() <= 0 {
		return nil, keyErr("alerts.endpoint_p95", "must be positive")
	}
	if c.Alerts.SlotLag <= 0 {
		return nil, keyErr("alerts.slot_lag", "must be positive")
	}
	secrets, err := parseSecrets("signing.secrets", c.Signing.Secrets)
	if err != nil {
		return nil, err
	}
	if c.Signing.SecretsFile != "" {
		fromFile, err := readFile("signing.secrets_file", c.Signing.SecretsFile)
		if err != nil {
			return nil, err
		}
		secrets = append(secrets, fromFile...)
	}
	out.Secrets = secrets
	for name, list := range c.Signing.Named {
		if !nameRe.MatchString(name) {
			return nil, keyErr("signing.named", "%q is not a secret name (lower-case letters, digits and underscores)", name)
		}
		named, err := parseSecrets("signing.named."+name, list)
		if err != nil {
			return nil, err
		}
		if len(named) == 0 {
			return nil, keyErr("signing.named."+name, "lists no secret")
		}
		if out.NamedSecrets == nil {
			out.NamedSecrets = map[string][]outbox.Secret{}
		}
		out.NamedSecrets[name] = named
	}
	if out.Portal, err = c.Portal.resolve(secrets); err != nil {
		return nil, err
	}
	if out.PortalListen = c.PortalListen; c.PortalListen != "" {
		if _, _, err := net.SplitHostPort(c.PortalListen); err != nil {
			return nil, keyErr("portal_listen", "%q is not host:port", c.PortalListen)
		}
	}
	switch c.Signing.PerEndpoint {
	case "", PerEndpointShared:
	case PerEndpointDerived:
		out.Derived = true
	default:
		return nil, keyErr("signing.per_endpoint", "%q is not %s or %s", c.Signing.PerEndpoint, PerEndpointShared, PerEndpointDerived)
	}

	builtin := Endpoint{
		Method:           "POST",
		Timeout:          TimeoutDefault,
		MaxAttempts:      MaxAttemptsDefault,
		BackoffBase:      BackoffBaseDefault,
		BackoffCap:       BackoffCapDefault,
		FailureThreshold: FailureThresholdDefault,
		Cooldown:         CooldownDefault,
		MaxCooldown:      MaxCooldownDefault,
		MaxInFlight:      MaxInFlightDefault,
		Secrets:          secrets,
	}
	def, err := resolveEndpoint("defaults", builtin, c.Defaults, readFile)
	if err != nil {
		return nil, err
	}
	def.URL = "" // a default URL would make every unknown endpoint deliverable
	// The defaults' secrets are the masters endpoints derive theirs from.
	def.OwnSecrets = false
	if c.Defaults.URL != nil {
		return nil, keyErr("defaults.url", "a URL cannot be a default; set it per endpoint or per row")
	}
	out.Defaults = def
	out.Endpoints = make(map[string]Endpoint, len(c.Endpoints))
	// defaults.allow_row_url is for endpoints that are not configured: a
	// configured endpoint's credentials go to rows' urls only where it
	// says so itself.
	base := def
	base.AllowRowURL = false
	for name, ec := range c.Endpoints {
		if name == "" {
			return nil, keyErr("endpoints", "an endpoint name cannot be empty")
		}
		ep, err := resolveEndpoint("endpoints."+name, base, ec, readFile)
		if err != nil {
			return nil, err
		}
		ep.Name, ep.Configured, ep.Source = name, true, SourceFile
		out.Endpoints[name] = ep
	}
	return out, nil
}

func resolveEndpoint(key string, base Endpoint, ec EndpointConfig, readFile secretsReader) (Endpoint, error) {
	ep := base
	if ec.URL != nil {
		if err := ValidateURL(*ec.URL); err != nil {
			return ep, keyErr(key+".url", "%v", err)
		}
		ep.URL = *ec.URL
		if macro.Contains(ep.URL) {
			if _, err := macro.Parse(ep.URL, true); err != nil {
				return ep, keyErr(key+".url", "%v", err)
			}
		}
	}
	if ec.Body != nil {
		if _, err := macro.Parse(*ec.Body, false); err != nil {
			return ep, keyErr(key+".body", "%v", err)
		}
		body := *ec.Body
		ep.Body = &body
	}
	if ec.Method != nil {
		m := strings.ToUpper(*ec.Method)
		if !methods[m] {
			return ep, keyErr(key+".method", "%q is not one of GET, POST, PUT, PATCH", *ec.Method)
		}
		ep.Method = m
	} else if ec.URL != nil && strings.Contains(*ec.URL, "{") {
		ep.Method = "GET" // postback templates default to GET
	}
	setDur := func(name string, dst *time.Duration, v *Duration, positive bool) error {
		if v == nil {
			return nil
		}
		if positive && v.D() <= 0 {
			return keyErr(key+"."+name, "must be positive")
		}
		*dst = v.D()
		return nil
	}
	setInt := func(name string, dst *int, v *int, min int) error {
		if v == nil {
			return nil
		}
		if *v < min {
			return keyErr(key+"."+name, "must be at least %d", min)
		}
		*dst = *v
		return nil
	}
	for _, err := range []error{
		setDur("timeout", &ep.Timeout, ec.Timeout, true),
		setDur("backoff_base", &ep.BackoffBase, ec.BackoffBase, true),
		setDur("backoff_cap", &ep.BackoffCap, ec.BackoffCap, true),
		setDur("cooldown", &ep.Cooldown, ec.Cooldown, true),
		setDur("max_cooldown", &ep.MaxCooldown, ec.MaxCooldown, true),
		setInt("max_attempts", &ep.MaxAttempts, ec.MaxAttempts, 1),
		setInt("failure_threshold", &ep.FailureThreshold, ec.FailureThreshold, 1),
		setInt("max_in_flight", &ep.MaxInFlight, ec.MaxInFlight, 1),
	} {
		if err != nil {
			return ep, err
		}
	}
	if ep.BackoffBase > ep.BackoffCap {
		return ep, keyErr(key+".backoff_base", "%s is above backoff_cap %s", ep.BackoffBase, ep.BackoffCap)
	}
	if ep.Cooldown > ep.MaxCooldown {
		return ep, keyErr(key+".cooldown", "%s is above max_cooldown %s", ep.Cooldown, ep.MaxCooldown)
	}
	if ec.RateLimit != nil {
		ep.RateLimit = *ec.RateLimit
	}
	if ec.Secrets != nil || ec.SecretsFile != nil {
		s, err := parseSecrets(key+".secrets", ec.Secrets)
		if err != nil {
			return ep, err
		}
		if ec.SecretsFile != nil {
			fromFile, err := readFile(key+".secrets_file", *ec.SecretsFile)
			if err != nil {
				return ep, err
			}
			s = append(s, fromFile...)
		}
		ep.Secrets, ep.OwnSecrets = s, true
	}
	if ec.Headers != nil {
		h := make(map[string]string, len(base.Headers)+len(ec.Headers))
		for k, v := range base.Headers {
			h[k] = v
		}
		for k, v := range ec.Headers {
			if k == "" || strings.ContainsAny(k, " :\r\n") {
				return ep, keyErr(key+".headers", "%q is not a valid header name", k)
			}
			h[k] = v
		}
		ep.Headers = h
	}
	if ec.Success != nil {
		for i, s := range ec.Success.Status {
			if s < 100 || s > 599 {
				return ep, keyErr(fmt.Sprintf("%s.success.status[%d]", key, i), "%d is not an HTTP status", s)
			}
		}
		switch ec.Success.BodyMismatch {
		case "", BodyMismatchRetry, BodyMismatchDeadLetter:
		default:
			return ep, keyErr(key+".success.body_mismatch", "%q is not %s or %s", ec.Success.BodyMismatch, BodyMismatchRetry, BodyMismatchDeadLetter)
		}
		ep.Success = *ec.Success
	}
	if ec.RetryOn != nil {
		for i, s := range ec.RetryOn {
			if s < 100 || s > 599 {
				return ep, keyErr(fmt.Sprintf("%s.retry_on[%d]", key, i), "%d is not an HTTP status", s)
			}
		}
		ep.RetryOn = ec.RetryOn
	}
	if ec.Ordered != nil {
		ep.Ordered = *ec.Ordered
	}
	if ec.RedactPath != nil {
		ep.RedactPath = *ec.RedactPath
	}
	if ec.AllowRowURL != nil {
		ep.AllowRowURL = *ec.AllowRowURL
	}
	if ec.RowURLHosts != nil {
		ep.RowURLHosts = make([]string, len(ec.RowURLHosts))
		for i, h := range ec.RowURLHosts {
			norm, err := rowURLHost(h)
			if err != nil {
				return ep, keyErr(fmt.Sprintf("%s.row_url_hosts[%d]", key, i), "%q %v", h, err)
			}
			ep.RowURLHosts[i] = norm
		}
	}
	return ep, nil
}

// rowURLHost checks an entry of row_url_hosts and returns it as RowURLHost
// compares it: a host name (or *. and one of at least two labels), or an
// IP address, lower-case, without a trailing dot. A port is refused rather
// than ignored, so that nobody believes it narrows the entry.
func rowURLHost(h string) (string, error) {
	h = strings.TrimSuffix(strings.ToLower(h), ".")
	if a, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil && a.Zone() == "" {
		return a.String(), nil
	}
	name, wild := strings.CutPrefix(h, "*.")
	switch {
	case strings.Contains(h, "/"):
		return "", errors.New("is not a host name: write the host alone (pb.example.com)")
	case strings.Contains(h, ":"):
		return "", errors.New("has a port: write the host alone; it matches every port")
	case wild && !strings.Contains(name, "."):
		return "", errors.New("is too wide: a wildcard needs a name of two labels at least (*.example.com)")
	case !hostNameRe.MatchString(name) || len(name) > 253:
		return "", errors.New("is not a host name (letters, digits, - and _ in dot-separated labels; an internationalized name in its xn-- form; a wildcard only as a leading *.)")
	}
	return h, nil
}

var hostNameRe = regexp.MustCompile(`^[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_]([a-z0-9_-]{0,62}))*$`)

// RowURLHost reports whether host, a row url's host name without its
// port, is one ep's row_url_hosts allow: any when the list is empty;
// otherwise equal to an entry (case and a trailing dot aside, an IP
// address in any of its spellings), or a name below a *. entry's.
func (ep Endpoint) RowURLHost(host string) bool {
	if len(ep.RowURLHosts) == 0 {
		return true
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	a, err := netip.ParseAddr(host)
	isAddr := err == nil
	if isAddr {
		host = a.WithZone("").String()
	}
	for _, e := range ep.RowURLHosts {
		suffix, wild := strings.CutPrefix(e, "*")
		if host == e || wild && !isAddr && len(host) > len(suffix) && strings.HasSuffix(host, suffix) {
			return true
		}
	}
	return false
}

func parseSecrets(key string, in []string) ([]outbox.Secret, error) {
	out := make([]outbox.Secret, 0, len(in))
	for i, s := range in {
		sec, err := outbox.ParseSecret(s)
		if err != nil {
			// Never echo the value: it is a secret, even when malformed.
			return nil, keyErr(fmt.Sprintf("%s[%d]", key, i), "not a valid secret (want whsec_ followed by base64; `postbox secret new` makes one)")
		}
		if sec.Len() < MinSecretBytes {
			return nil, keyErr(fmt.Sprintf("%s[%d]", key, i), "a key of %d bytes is too short to sign with (at least %d; `postbox secret new` makes one of 32)", sec.Len(), MinSecretBytes)
		}
		out = append(out, sec)
	}
	return out, nil
}

// Shortest secrets accepted: a signing key of MinSecretBytes, an admin
// token of MinAdminTokenLen characters.
const (
	MinSecretBytes   = 24
	MinAdminTokenLen = 16
)

// readSecretsFile reads one secret a line; blank lines and # comments are
// skipped. Errors never show the file's content.
func readSecretsFile(key, path string) ([]outbox.Secret, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, keyErr(key, "cannot read %s: %v", path, errors.Unwrap(err))
	}
	return parseSecretsFile(key, path, data)
}

// parseSecretsFile parses the content of the secrets file at path.
func parseSecretsFile(key, path string, data []byte) ([]outbox.Secret, error) {
	var lines []string
	for _, line := range strings.Split(string(data), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			lines = append(lines, line)
		}
	}
	if len(lines) == 0 {
		return nil, keyErr(key, "%s holds no secret", path)
	}
	s, err := parseSecrets(key, lines)
	if err != nil {
		return nil, keyErr(key, "%s: a line is not a valid secret (want whsec_ followed by base64)", path)
	}
	return s, nil
}

// secretFiles lists the secrets files the configuration reads, so they
// can be watched for rotations.
func (c *File) secretFiles() []string {
	var out []string
	if c.Signing.SecretsFile != "" {
		out = append(out, c.Signing.SecretsFile)
	}
	if c.Defaults.SecretsFile != nil {
		out = append(out, *c.Defaults.SecretsFile)
	}
	for _, ec := range c.Endpoints {
		if ec.SecretsFile != nil {
			out = append(out, *ec.SecretsFile)
		}
	}
	return out
}

// ExposedFile is a file holding secrets that group or others may read.
type ExposedFile struct {
	Path string
	Mode os.FileMode
}

// ExposedFiles are those of the configuration file at path (it may hold
// admin_token and secrets), admin_tls_key and the secrets files whose
// mode lets group or others read them: another local user, or a neighbour
// container sharing the volume, could sign deliveries or pose as the
// admin listener. Files that cannot be stat'ed are left to the reads that
// fail on them.
func (c *Config) ExposedFiles(path string) []ExposedFile {
	var out []ExposedFile
	for _, p := range append([]string{path, c.AdminTLSKey}, c.SecretFiles...) {
		if p == "" {
			continue
		}
		if st, err := os.Stat(p); err == nil && st.Mode().Perm()&0o077 != 0 {
			out = append(out, ExposedFile{Path: p, Mode: st.Mode().Perm()})
		}
	}
	return out
}

// ValidateURL checks an endpoint URL (macros such as {payload.click_id}
// allowed): absolute, http or https, with a host.
func ValidateURL(raw string) error {
	_, err := ParseTargetURL(macroRe.ReplaceAllString(raw, "x"))
	return err
}

// ParseTargetURL parses a URL to deliver to (macros already expanded) and
// checks it as ValidateURL does.
func ParseTargetURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New("not a valid URL")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("scheme %q is not http or https", u.Scheme)
	}
	if u.Host == "" {
		return nil, errors.New("the URL has no host")
	}
	return u, nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// DefaultAlerts are the alert thresholds when none are configured.
func DefaultAlerts() Alerts { return Default().Alerts.resolve() }

func (a AlertsConfig) resolve() Alerts {
	return Alerts{DeadLettersPerHour: a.DeadLettersPerHour, OldestPending: a.OldestPending.D(),
		EndpointP95: a.EndpointP95.D(), SlotLag: int64(a.SlotLag)}
}

// MinPortalKeyLen is the shortest portal.key accepted.
const MinPortalKeyLen = 32

// resolve checks the portal's keys and picks its signing key: portal.key,
// else an HMAC of the newest signing secret under a label of its own, so
// the key is neither a signing secret nor any endpoint's derived one.
func (p PortalConfig) resolve(secrets []outbox.Secret) (Portal, error) {
	out := Portal{PublicURL: strings.TrimRight(p.PublicURL, "/"), ShowSecret: p.ShowSecret,
		AllowReplay: p.AllowReplay, ShowResponse: p.ShowResponse}
	if p.PublicURL != "" {
		u, err := url.Parse(p.PublicURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			return out, keyErr("portal.public_url", "want an absolute http or https URL without a query, such as https://partners.example.com")
		}
	}
	switch {
	case p.Key != "" && len(p.Key) < MinPortalKeyLen:
		return out, keyErr("portal.key", "too short: at least %d characters (`postbox secret new` makes a good one)", MinPortalKeyLen)
	case p.Key != "":
		out.Key = []byte(p.Key)
	case len(secrets) > 0:
		m := hmac.New(sha256.New, []byte(secrets[0].Reveal()))
		m.Write([]byte("postbox portal token key v1"))
		out.Key, out.KeyDerived = m.Sum(nil), true
	}
	return out, nil
}
