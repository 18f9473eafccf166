// Package config is postbox's configuration: the YAML file of SPEC §2,
// environment overrides, validation that names the offending key, and the
// per-endpoint settings resolved against their defaults.
package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/internal/deliver"
)

// Defaults of the global and per-endpoint settings.
const (
	SlotDefault                  = "postbox"
	PublicationDefault           = "postbox"
	AdminListenDefault           = "127.0.0.1:9187"
	LogLevelDefault              = "info"
	EventRetentionDefault        = 168 * time.Hour
	DeliveryRetentionDefault     = 168 * time.Hour
	MaxBodyDefault               = 1 << 20
	ShutdownGraceDefault         = 20 * time.Second
	LeaseDefault                 = 60 * time.Second
	SweepIntervalDefault         = 5 * time.Second
	StatusIntervalDefault        = 10 * time.Second
	StallTimeoutDefault          = 30 * time.Second
	LeaderLeaseDefault           = 3 * time.Second
	MetricsEndpointLabelsDefault = 50
	MaxConcurrencyDefault        = 256
	DeadLettersPerHourDefault    = 1
	OldestPendingDefault         = 30 * time.Minute
	EndpointP95Default           = 2 * time.Second
	SlotLagDefault               = 1 << 30

	TimeoutDefault          = 15 * time.Second
	MaxAttemptsDefault      = 5
	BackoffBaseDefault      = 30 * time.Second
	BackoffCapDefault       = time.Hour
	FailureThresholdDefault = 10
	CooldownDefault         = 5 * time.Minute
	MaxCooldownDefault      = time.Hour
	MaxInFlightDefault      = 8
)

// Environment variables that override the file.
const (
	EnvConfig              = "POSTBOX_CONFIG"
	EnvDatabaseURL         = "POSTBOX_DATABASE_URL"
	EnvAdminListen         = "POSTBOX_ADMIN_LISTEN"
	EnvAdminToken          = "POSTBOX_ADMIN_TOKEN"
	EnvAllowPrivateTargets = "POSTBOX_ALLOW_PRIVATE_TARGETS"
	EnvLogLevel            = "POSTBOX_LOG_LEVEL"
	EnvSigningSecrets      = "POSTBOX_SIGNING_SECRETS"
)

// Config is the whole configuration. Every key is optional.
type Config struct {
	DatabaseURL         string   `yaml:"database_url"`
	OutboxTable         string   `yaml:"outbox_table"`
	Slot                string   `yaml:"slot"`
	Publication         string   `yaml:"publication"`
	AdminListen         string   `yaml:"admin_listen"`
	AdminToken          string   `yaml:"admin_token"`
	LogLevel            string   `yaml:"log_level"`
	LogPayloads         bool     `yaml:"log_payloads"`
	AllowPrivateTargets bool     `yaml:"allow_private_targets"`
	AllowedCIDRs        []string `yaml:"allowed_cidrs"`
	OutboxRetention     Duration `yaml:"outbox_retention"`
	EventRetention      Duration `yaml:"event_retention"`
	DeliveryRetention   Duration `yaml:"delivery_retention"`
	MaxBody             ByteSize `yaml:"max_body"`
	// ShutdownGrace bounds how long SIGTERM waits for in-flight attempts.
	ShutdownGrace Duration `yaml:"shutdown_grace"`
	// Lease is how long an instance's claims outlive its last heartbeat (it
	// heartbeats every third of it): a crashed or frozen instance's claims
	// return to the queue after it.
	Lease Duration `yaml:"lease"`
	// SweepInterval is the safety-net poll of the queue; the hot path never
	// waits for it.
	SweepInterval Duration `yaml:"sweep_interval"`
	// StatusInterval is the longest gap between standby status updates.
	StatusInterval Duration `yaml:"status_interval"`
	// StallTimeout ends a replication session that received nothing (not
	// even the replies its status updates ask for) for this long.
	StallTimeout Duration `yaml:"stall_timeout"`
	// LeaderLease is how long the streaming instance's leadership outlives
	// its last renewal: a standby takes over that long after the leader
	// dies or freezes.
	LeaderLease Duration `yaml:"leader_lease"`
	// MaxConcurrency bounds the attempts in flight across all endpoints;
	// each endpoint also has its own max_in_flight.
	MaxConcurrency int `yaml:"max_concurrency"`
	// MetricsEndpointLabels caps the endpoint label of metrics: the first
	// N configured endpoints (by name) get their own, every other is
	// "other", so a million per-row URLs cannot explode cardinality.
	MetricsEndpointLabels int                       `yaml:"metrics_endpoint_labels"`
	Alerts                Alerts                    `yaml:"alerts"`
	Signing               Signing                   `yaml:"signing"`
	Defaults              EndpointConfig            `yaml:"defaults"`
	Endpoints             map[string]EndpointConfig `yaml:"endpoints"`

	table     outbox.Table
	secrets   []outbox.Secret
	allowed   []netip.Prefix
	defaults  Endpoint
	endpoints map[string]Endpoint
}

// Alerts are the thresholds at which postbox's alerts fire.
type Alerts struct {
	// DeadLettersPerHour: dead letters within the last hour that fire
	// dead_letters_rising.
	DeadLettersPerHour int `yaml:"dead_letters_per_hour"`
	// OldestPending: an undelivered event older than this fires
	// oldest_pending.
	OldestPending Duration `yaml:"oldest_pending"`
	// EndpointP95: an endpoint whose 24 h p95 latency is above this fires
	// endpoint_latency.
	EndpointP95 Duration `yaml:"endpoint_p95"`
	// SlotLag: WAL retained by the slot above this fires slot_lag (so does
	// a wal_status other than reserved); /readyz fails past it.
	SlotLag ByteSize `yaml:"slot_lag"`
}

// Signing holds the global signing secrets; every active secret signs.
type Signing struct {
	Secrets []string `yaml:"secrets"`
	// SecretsFile names a file of secrets, one a line (a mounted
	// Kubernetes secret, say); postbox re-reads it when it changes.
	SecretsFile string `yaml:"secrets_file"`
}

// EndpointConfig is one endpoint's settings as written; unset keys inherit
// from defaults.
type EndpointConfig struct {
	URL              *string           `yaml:"url"`
	Method           *string           `yaml:"method"`
	Timeout          *Duration         `yaml:"timeout"`
	MaxAttempts      *int              `yaml:"max_attempts"`
	BackoffBase      *Duration         `yaml:"backoff_base"`
	BackoffCap       *Duration         `yaml:"backoff_cap"`
	FailureThreshold *int              `yaml:"failure_threshold"`
	Cooldown         *Duration         `yaml:"cooldown"`
	MaxCooldown      *Duration         `yaml:"max_cooldown"`
	RateLimit        *Rate             `yaml:"rate_limit"`
	MaxInFlight      *int              `yaml:"max_in_flight"`
	Secrets          []string          `yaml:"secrets"`
	SecretsFile      *string           `yaml:"secrets_file"`
	Headers          map[string]string `yaml:"headers"`
	// Body is a body template for POST, PUT and PATCH (the payload when
	// unset): JSON-escaped values, or form-escaped ones when the
	// endpoint's Content-Type header is application/x-www-form-urlencoded.
	Body    *string  `yaml:"body"`
	Success *Success `yaml:"success"`
	RetryOn []int    `yaml:"retry_on"`
	Ordered *bool    `yaml:"ordered"`
}

// Success is a partner's own rule for a successful delivery.
type Success struct {
	Status       []int  `yaml:"status"`
	BodyContains string `yaml:"body_contains"`
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
	Secrets          []outbox.Secret
	Headers          map[string]string
	Body             string
	// URLTemplate and BodyTemplate are the parsed URL and body when they
	// carry macros (nil otherwise).
	URLTemplate  *deliver.Template
	BodyTemplate *deliver.Template
	Success      Success
	RetryOn      []int
	Ordered      bool
}

// Error is a configuration error naming the key it is about.
type Error struct {
	Key string
	Msg string
}

func (e *Error) Error() string {
	if e.Key == "" {
		return "config: " + e.Msg
	}
	return "config: " + e.Key + ": " + e.Msg
}

func keyErr(key, format string, args ...any) error {
	return &Error{Key: key, Msg: fmt.Sprintf(format, args...)}
}

// Default returns the configuration with every default filled in.
func Default() *Config {
	return &Config{
		OutboxTable:           outbox.DefaultTable,
		Slot:                  SlotDefault,
		Publication:           PublicationDefault,
		AdminListen:           AdminListenDefault,
		LogLevel:              LogLevelDefault,
		EventRetention:        Duration(EventRetentionDefault),
		DeliveryRetention:     Duration(DeliveryRetentionDefault),
		MaxBody:               MaxBodyDefault,
		ShutdownGrace:         Duration(ShutdownGraceDefault),
		Lease:                 Duration(LeaseDefault),
		SweepInterval:         Duration(SweepIntervalDefault),
		StatusInterval:        Duration(StatusIntervalDefault),
		StallTimeout:          Duration(StallTimeoutDefault),
		LeaderLease:           Duration(LeaderLeaseDefault),
		MetricsEndpointLabels: MetricsEndpointLabelsDefault,
		MaxConcurrency:        MaxConcurrencyDefault,
		Alerts: Alerts{
			DeadLettersPerHour: DeadLettersPerHourDefault,
			OldestPending:      Duration(OldestPendingDefault),
			EndpointP95:        Duration(EndpointP95Default),
			SlotLag:            SlotLagDefault,
		},
	}
}

// Load reads the file at path (none when path is empty), applies the
// environment through getenv (os.Getenv when nil), and validates.
func Load(path string, getenv func(string) string) (*Config, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	cfg := Default()
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, &Error{Msg: fmt.Sprintf("read %s: %v", path, err)}
		}
		if err := cfg.decode(data); err != nil {
			return nil, err
		}
	}
	if err := cfg.applyEnv(getenv); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// Parse decodes YAML over the defaults and validates, without environment.
func Parse(data []byte) (*Config, error) {
	cfg := Default()
	if err := cfg.decode(data); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

func (c *Config) decode(data []byte) error {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return &Error{Msg: "not valid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	if len(root.Content) == 0 {
		return nil // empty file
	}
	return decodeNode("", root.Content[0], reflect.ValueOf(c).Elem())
}

func (c *Config) applyEnv(getenv func(string) string) error {
	if v := getenv(EnvDatabaseURL); v != "" {
		c.DatabaseURL = v
	}
	if v := getenv(EnvAdminListen); v != "" {
		c.AdminListen = v
	}
	if v := getenv(EnvAdminToken); v != "" {
		c.AdminToken = v // from a secret store, rather than the file
	}
	if v := getenv(EnvLogLevel); v != "" {
		c.LogLevel = v
	}
	if v := getenv(EnvAllowPrivateTargets); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return keyErr(EnvAllowPrivateTargets, "want true or false, got %q", v)
		}
		c.AllowPrivateTargets = b
	}
	if v := getenv(EnvSigningSecrets); v != "" {
		c.Signing.Secrets = strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' })
	}
	return nil
}

var (
	nameRe    = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
	macroRe   = regexp.MustCompile(`\{[^{}]*\}`)
	logLevels = map[string]bool{"debug": true, "info": true, "warn": true, "error": true}
	methods   = map[string]bool{"GET": true, "POST": true, "PUT": true, "PATCH": true}
)

// Validate checks every setting and resolves the endpoints. Load and
// Parse call it; call it again after changing a Config by hand.
func (c *Config) Validate() error {
	if c.DatabaseURL == "" {
		// Not an error here: commands that need the database say so.
	} else if _, err := url.Parse(c.DatabaseURL); err != nil && !strings.Contains(c.DatabaseURL, "=") {
		return keyErr("database_url", "not a URL or key=value connection string")
	}
	t, err := outbox.ParseTable(c.OutboxTable)
	if err != nil {
		return keyErr("outbox_table", "%v", err)
	}
	c.table = t
	if !nameRe.MatchString(c.Slot) {
		return keyErr("slot", "%q is not a valid replication slot name (lower-case letters, digits and underscores, at most 63)", c.Slot)
	}
	if !nameRe.MatchString(c.Publication) {
		return keyErr("publication", "%q is not a valid publication name (lower-case letters, digits and underscores, at most 63)", c.Publication)
	}
	if !logLevels[c.LogLevel] {
		return keyErr("log_level", "%q is not one of debug, info, warn, error", c.LogLevel)
	}
	host, _, err := net.SplitHostPort(c.AdminListen)
	if c.AdminListen != "" && err != nil {
		return keyErr("admin_listen", "%q is not host:port", c.AdminListen)
	}
	if c.AdminListen != "" && !isLoopback(host) && c.AdminToken == "" {
		return keyErr("admin_token", "required when admin_listen (%s) is not a loopback address", c.AdminListen)
	}
	c.allowed = nil
	for i, cidr := range c.AllowedCIDRs {
		p, err := netip.ParsePrefix(cidr)
		if err != nil {
			return keyErr(fmt.Sprintf("allowed_cidrs[%d]", i), "%q is not a CIDR such as 10.1.0.0/16", cidr)
		}
		c.allowed = append(c.allowed, p.Masked())
	}
	if c.MaxBody <= 0 {
		return keyErr("max_body", "must be positive")
	}
	if c.Lease.D() < time.Second {
		return keyErr("lease", "must be at least 1s")
	}
	if c.SweepInterval.D() <= 0 {
		return keyErr("sweep_interval", "must be positive")
	}
	if c.StatusInterval.D() <= 0 {
		return keyErr("status_interval", "must be positive")
	}
	if c.StallTimeout.D() <= c.StatusInterval.D() {
		return keyErr("stall_timeout", "must be longer than status_interval (%s)", c.StatusInterval.D())
	}
	if c.LeaderLease.D() < 300*time.Millisecond {
		return keyErr("leader_lease", "must be at least 300ms")
	}
	if c.MaxConcurrency < 1 {
		return keyErr("max_concurrency", "must be at least 1")
	}
	if c.MetricsEndpointLabels < 0 {
		return keyErr("metrics_endpoint_labels", "must not be negative")
	}
	if c.Alerts.DeadLettersPerHour < 1 {
		return keyErr("alerts.dead_letters_per_hour", "must be at least 1")
	}
	if c.Alerts.OldestPending.D() <= 0 {
		return keyErr("alerts.oldest_pending", "must be positive")
	}
	if c.Alerts.EndpointP95.D() <= 0 {
		return keyErr("alerts.endpoint_p95", "must be positive")
	}
	if c.Alerts.SlotLag <= 0 {
		return keyErr("alerts.slot_lag", "must be positive")
	}
	secrets, err := parseSecrets("signing.secrets", c.Signing.Secrets)
	if err != nil {
		return err
	}
	if c.Signing.SecretsFile != "" {
		fromFile, err := readSecretsFile("signing.secrets_file", c.Signing.SecretsFile)
		if err != nil {
			return err
		}
		secrets = append(secrets, fromFile...)
	}
	c.secrets = secrets

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
	def, err := resolve("defaults", builtin, c.Defaults)
	if err != nil {
		return err
	}
	def.URL = "" // a default URL would make every unknown endpoint deliverable
	if c.Defaults.URL != nil {
		return keyErr("defaults.url", "a URL cannot be a default; set it per endpoint or per row")
	}
	c.defaults = def
	c.endpoints = make(map[string]Endpoint, len(c.Endpoints))
	for name, ec := range c.Endpoints {
		if name == "" {
			return keyErr("endpoints", "an endpoint name cannot be empty")
		}
		ep, err := resolve("endpoints."+name, def, ec)
		if err != nil {
			return err
		}
		ep.Name, ep.Configured = name, true
		c.endpoints[name] = ep
	}
	return nil
}

func resolve(key string, base Endpoint, ec EndpointConfig) (Endpoint, error) {
	ep := base
	if ec.URL != nil {
		if err := ValidateURL(*ec.URL); err != nil {
			return ep, keyErr(key+".url", "%v", err)
		}
		ep.URL = *ec.URL
		ep.URLTemplate = nil
		if deliver.HasMacros(ep.URL) {
			t, err := deliver.ParseTemplate(ep.URL, true)
			if err != nil {
				return ep, keyErr(key+".url", "%v", err)
			}
			ep.URLTemplate = &t
		}
	}
	if ec.Body != nil {
		t, err := deliver.ParseTemplate(*ec.Body, false)
		if err != nil {
			return ep, keyErr(key+".body", "%v", err)
		}
		ep.Body, ep.BodyTemplate = *ec.Body, &t
	}
	if ec.Method != nil {
		m := strings.ToUpper(*ec.Method)
		if !methods[m] {
			return ep, keyErr(key+".method", "%q is not one of GET, POST, PUT, PATCH", *ec.Method)
		}
		ep.Method = m
	} else if ec.URL != nil && strings.Contains(*ec.URL, "{") {
		ep.Method = "GET" // postback templates default to GET (SPEC §2)
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
			fromFile, err := readSecretsFile(key+".secrets_file", *ec.SecretsFile)
			if err != nil {
				return ep, err
			}
			s = append(s, fromFile...)
		}
		ep.Secrets = s
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
	return ep, nil
}

func parseSecrets(key string, in []string) ([]outbox.Secret, error) {
	out := make([]outbox.Secret, 0, len(in))
	for i, s := range in {
		sec, err := outbox.ParseSecret(s)
		if err != nil {
			// Never echo the value: it is a secret, even when malformed.
			return nil, keyErr(fmt.Sprintf("%s[%d]", key, i), "not a valid secret (want whsec_ followed by base64; `postbox secret new` makes one)")
		}
		out = append(out, sec)
	}
	return out, nil
}

// readSecretsFile reads one secret a line; blank lines and # comments are
// skipped. Errors never show the file's content.
func readSecretsFile(key, path string) ([]outbox.Secret, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, keyErr(key, "cannot read %s: %v", path, errors.Unwrap(err))
	}
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

// SecretFiles lists the secrets files the configuration reads, so they
// can be watched for rotations.
func (c *Config) SecretFiles() []string {
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

// Guard is the SSRF guard this configuration asks for.
func (c *Config) Guard() deliver.Guard {
	return deliver.Guard{AllowAll: c.AllowPrivateTargets, Allowed: c.allowed}
}

// Table is the validated outbox table.
func (c *Config) Table() outbox.Table { return c.table }

// Secrets are the global signing secrets, newest first.
func (c *Config) Secrets() []outbox.Secret { return c.secrets }

// Endpoint returns the effective settings for the named endpoint: its own
// when configured, the defaults otherwise (Configured false, URL empty).
func (c *Config) Endpoint(name string) Endpoint {
	if ep, ok := c.endpoints[name]; ok {
		return ep
	}
	ep := c.defaults
	ep.Name = name
	return ep
}

// ConfiguredEndpoints returns the configured endpoints' effective settings.
func (c *Config) ConfiguredEndpoints() map[string]Endpoint { return c.endpoints }

// decodeNode decodes n into v, refusing unknown keys and naming the key
// path in every error.
func decodeNode(path string, n *yaml.Node, v reflect.Value) error {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	label := path
	if label == "" {
		label = "(top level)"
	}
	if v.Kind() == reflect.Pointer {
		if n.Tag == "!!null" {
			v.Set(reflect.Zero(v.Type()))
			return nil
		}
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		return decodeNode(path, n, v.Elem())
	}
	if _, ok := v.Addr().Interface().(yaml.Unmarshaler); ok {
		if err := n.Decode(v.Addr().Interface()); err != nil {
			return keyErr(label, "%s", yamlMsg(err))
		}
		return nil
	}
	switch v.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return keyErr(label, "want a mapping of keys (line %d)", n.Line)
		}
		fields := map[string]int{}
		for i := 0; i < v.NumField(); i++ {
			tag := v.Type().Field(i).Tag.Get("yaml")
			if name, _, _ := strings.Cut(tag, ","); name != "" && name != "-" {
				fields[name] = i
			}
		}
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := n.Content[i].Value
			full := join(path, key)
			idx, ok := fields[key]
			if !ok {
				return keyErr(full, "unknown key (line %d)", n.Content[i].Line)
			}
			if seen[key] {
				return keyErr(full, "given twice (line %d)", n.Content[i].Line)
			}
			seen[key] = true
			if err := decodeNode(full, n.Content[i+1], v.Field(idx)); err != nil {
				return err
			}
		}
		return nil
	case reflect.Map:
		if n.Tag == "!!null" {
			return nil
		}
		if n.Kind != yaml.MappingNode {
			return keyErr(label, "want a mapping (line %d)", n.Line)
		}
		if v.IsNil() {
			v.Set(reflect.MakeMap(v.Type()))
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := n.Content[i].Value
			full := join(path, key)
			if v.MapIndex(reflect.ValueOf(key)).IsValid() {
				return keyErr(full, "given twice (line %d)", n.Content[i].Line)
			}
			elem := reflect.New(v.Type().Elem()).Elem()
			if err := decodeNode(full, n.Content[i+1], elem); err != nil {
				return err
			}
			v.SetMapIndex(reflect.ValueOf(key), elem)
		}
		return nil
	case reflect.Slice:
		if n.Tag == "!!null" {
			return nil
		}
		if n.Kind != yaml.SequenceNode {
			return keyErr(label, "want a list (line %d)", n.Line)
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			if err := decodeNode(fmt.Sprintf("%s[%d]", path, i), item, s.Index(i)); err != nil {
				return err
			}
		}
		v.Set(s)
		return nil
	default:
		if n.Kind != yaml.ScalarNode {
			return keyErr(label, "want a single value (line %d)", n.Line)
		}
		if err := n.Decode(v.Addr().Interface()); err != nil {
			return keyErr(label, "%s", yamlMsg(err))
		}
		return nil
	}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func yamlMsg(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) && len(te.Errors) > 0 {
		return te.Errors[0]
	}
	return strings.TrimPrefix(err.Error(), "yaml: ")
}
