// Package config is postbox's configuration, in two shapes:
//
//   - File is what the user wrote: the YAML document (every key optional),
//     with Default filling in the defaults and the environment overriding
//     it. Its Validate is pure and fast, and names the offending key.
//   - Config is what a relay runs on: Resolve reads the secrets files,
//     validates, and resolves every endpoint against the defaults, with
//     durations as time.Duration and templates validated (they are
//     compiled where they are used).
//
// Each default is an exported …Default constant, here: the relay passes
// the resolved values to the machinery (the stream, the dispatcher), which
// does not import this package; a test in relay keeps the fallbacks those
// have for callers that pass nothing the same.
package config

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/postbox-relay/postbox/outbox"
)

// Defaults of the global and per-endpoint settings.
const (
	SlotDefault                  = "postbox"
	PublicationDefault           = "postbox"
	AdminListenDefault           = "127.0.0.1:9187"
	LogLevelDefault              = "info"
	CPUSchedulingDefault         = "batch"
	EventRetentionDefault        = 168 * time.Hour
	DeliveryRetentionDefault     = 168 * time.Hour
	AttemptRetentionDefault      = 168 * time.Hour
	ReportRetentionDefault       = 400 * 24 * time.Hour
	MaxBodyDefault               = 1 << 20
	ShutdownGraceDefault         = 20 * time.Second
	LeaseDefault                 = 15 * time.Second
	SweepIntervalDefault         = 5 * time.Second
	StatusIntervalDefault        = 10 * time.Second
	StallTimeoutDefault          = 3 * StatusIntervalDefault
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
	EnvOutboxMessages      = "POSTBOX_OUTBOX_MESSAGES"
	EnvPortalKey           = "POSTBOX_PORTAL_KEY"
)

// File is the configuration as written. Every key is optional.
type File struct {
	DatabaseURL         string   `yaml:"database_url"`
	OutboxTable         string   `yaml:"outbox_table"`
	OutboxMessages      bool     `yaml:"outbox_messages"`      // see Config.Messages
	OutboxMessageRoles  []string `yaml:"outbox_message_roles"` // see Config.MessageRoles
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
	// AttemptRetention is how long every attempt's record is kept (the
	// latency percentiles read its last 24 hours).
	AttemptRetention Duration `yaml:"attempt_retention"`
	// SearchKeys are the top-level payload fields operators may search
	// events by (postbox events --payload KEY=VALUE); they are extracted
	// and indexed at ingest.
	SearchKeys []string `yaml:"search_keys"`
	// ReportRetention is how long the daily report rollups are kept
	// (postbox report, the partner portal): longer than the events, so a
	// year's reconciliation outlives them.
	ReportRetention Duration `yaml:"report_retention"`
	// ReportSum are the top-level numeric payload fields the daily report
	// sums per day and event type (payout, amount), from the events
	// ingested while they are listed.
	ReportSum []string `yaml:"report_sum"`
	MaxBody   ByteSize `yaml:"max_body"`
	// ShutdownGrace bounds how long SIGTERM waits for in-flight attempts.
	ShutdownGrace Duration `yaml:"shutdown_grace"`
	// Lease is how long an instance's claims outlive its last heartbeat (it
	// heartbeats every second): a frozen instance's claims, or those of one
	// cut off from the database, return to the queue after it. A crashed or
	// killed instance's return within seconds: its connection for life
	// ends with it (see store.LifeGraceDefault).
	Lease Duration `yaml:"lease"`
	// SweepInterval is the safety-net poll of the queue; the hot path never
	// waits for it.
	SweepInterval Duration `yaml:"sweep_interval"`
	// StatusInterval is the longest gap between standby status updates.
	StatusInterval Duration `yaml:"status_interval"`
	// StallTimeout ends a replication session that received nothing (not
	// even the replies its status updates ask for) for this long.
	StallTimeout Duration `yaml:"stall_timeout"`
	// AdminTokenOnLoopback: the console asks for admin_token on a loopback
	// listener too, where anything sharing loopback (a sidecar, an SSRF in
	// the application) could otherwise read it.
	AdminTokenOnLoopback bool `yaml:"admin_token_on_loopback"`
	// AdminTLSCert and AdminTLSKey are PEM files: with both, the admin
	// listener speaks HTTPS only; SIGHUP reads them again.
	AdminTLSCert string `yaml:"admin_tls_cert"`
	AdminTLSKey  string `yaml:"admin_tls_key"`
	// WalsenderNice, when not zero, is the nice value (-20 to 19) postbox
	// gives the walsender of each of its replication sessions, where the
	// server runs on the same machine and postbox may: for a database
	// whose CPUs run saturated (docs/operations.md, "Giving the walsender
	// its share").
	WalsenderNice int `yaml:"walsender_nice"`
	// CPUScheduling is how the kernel schedules postbox's own threads:
	// "batch" (SCHED_BATCH, where Linux has it), which leaves a CPU to
	// the process running there when postbox is woken, or "normal".
	CPUScheduling string `yaml:"cpu_scheduling"`
	// Migrate: run applies missing schema migrations at start; false (or
	// run --no-migrate) only checks the schema's version, for a role
	// without DDL rights.
	Migrate bool `yaml:"migrate"`
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
	MetricsEndpointLabels int          `yaml:"metrics_endpoint_labels"`
	Alerts                AlertsConfig `yaml:"alerts"`
	Signing               Signing      `yaml:"signing"`
	// PortalListen is an address for the partner portal alone (its pages
	// under /portal/), for a reverse proxy to publish without the console;
	// the admin listener serves them too.
	PortalListen string                    `yaml:"portal_listen"`
	Portal       PortalConfig              `yaml:"portal"`
	Defaults     EndpointConfig            `yaml:"defaults"`
	Endpoints    map[string]EndpointConfig `yaml:"endpoints"`
}

// AlertsConfig are the thresholds at which postbox's alerts fire, as
// written.
type AlertsConfig struct {
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
	// PerEndpoint is how endpoints without secrets of their own sign:
	// "shared" (the default) with the secrets above, "derived" each with
	// its own secret derived from each of them (outbox.DeriveSecret).
	PerEndpoint string `yaml:"per_endpoint"`
	// Named are secrets declared by name, for endpoints of
	// postbox.endpoints that sign with a fixed secret of their own (their
	// secret column names one): the database never holds a secret.
	Named map[string][]string `yaml:"named"`
}

// PortalConfig is the partner portal's settings (issue 53).
type PortalConfig struct {
	// PublicURL is the portal's address as partners reach it, printed in
	// links; https makes the session cookie Secure.
	PublicURL string `yaml:"public_url"`
	// Key signs portal links and sessions; when unset, a key derived from
	// the newest signing secret (never the secret itself) does.
	Key string `yaml:"key"`
	// ShowSecret shows a partner its current signing secret(s).
	ShowSecret bool `yaml:"show_secret"`
	// AllowReplay lets a partner resend its own dead letters.
	AllowReplay bool `yaml:"allow_replay"`
	// ShowResponse shows a partner the start of its own responses.
	ShowResponse bool `yaml:"show_response"`
}

// Ways endpoints without secrets of their own sign (signing.per_endpoint).
const (
	PerEndpointShared  = "shared"
	PerEndpointDerived = "derived"
)

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
	// RedactPath: the URL path segments recorded, shown and logged as ***.
	RedactPath *RedactPath `yaml:"redact_path"`
	// AllowRowURL lets a row naming this endpoint send to the row's own
	// url with this endpoint's headers. Without it, an endpoint configured
	// with a url refuses rows that carry one, and so does one without a
	// url whose headers (or the defaults') are set. Under defaults it is
	// for endpoints that are not configured: a configured endpoint that
	// lets rows choose where its credentials go says so itself.
	AllowRowURL *bool `yaml:"allow_row_url"`
	// RowURLHosts, when set, are the only hosts a row's url may name:
	// exact names, or *.name for any name below it; no port.
	RowURLHosts []string `yaml:"row_url_hosts"`
}

// Success is a partner's own rule for a successful delivery.
type Success struct {
	Status       []int  `yaml:"status"`
	BodyContains string `yaml:"body_contains"`
	// BodyMismatch is what a response whose status passes but whose body
	// lacks BodyContains ("success=false") becomes: BodyMismatchRetry (the
	// default: a failure retried like a 5xx, up to max_attempts) or
	// BodyMismatchDeadLetter (the partner's answer is final, as a 4xx is).
	BodyMismatch string `yaml:"body_mismatch"`
}

// The values of success.body_mismatch.
const (
	BodyMismatchRetry      = "retry"
	BodyMismatchDeadLetter = "dead_letter"
)

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

// secretLike is a signing secret ("whsec_…") written where it does not
// belong: a slot name, a duration, a key, a secrets file's path.
var secretLike = regexp.MustCompile("whsec_[^\\s\"'`]+")

// keyErr returns an *Error about key; neither the key nor the message
// repeats a secret-looking value of the file.
func keyErr(key, format string, args ...any) error {
	redact := func(s string) string { return secretLike.ReplaceAllString(s, "whsec_[redacted]") }
	return &Error{Key: redact(key), Msg: redact(fmt.Sprintf(format, args...))}
}

// Default returns the file with every default filled in.
func Default() *File {
	return &File{
		OutboxTable:           outbox.DefaultTable,
		Slot:                  SlotDefault,
		Publication:           PublicationDefault,
		AdminListen:           AdminListenDefault,
		LogLevel:              LogLevelDefault,
		EventRetention:        Duration(EventRetentionDefault),
		DeliveryRetention:     Duration(DeliveryRetentionDefault),
		AttemptRetention:      Duration(AttemptRetentionDefault),
		ReportRetention:       Duration(ReportRetentionDefault),
		MaxBody:               MaxBodyDefault,
		ShutdownGrace:         Duration(ShutdownGraceDefault),
		Lease:                 Duration(LeaseDefault),
		SweepInterval:         Duration(SweepIntervalDefault),
		StatusInterval:        Duration(StatusIntervalDefault),
		StallTimeout:          Duration(StallTimeoutDefault),
		LeaderLease:           Duration(LeaderLeaseDefault),
		CPUScheduling:         CPUSchedulingDefault,
		Migrate:               true,
		MetricsEndpointLabels: MetricsEndpointLabelsDefault,
		MaxConcurrency:        MaxConcurrencyDefault,
		Alerts: AlertsConfig{
			DeadLettersPerHour: DeadLettersPerHourDefault,
			OldestPending:      Duration(OldestPendingDefault),
			EndpointP95:        Duration(EndpointP95Default),
			SlotLag:            SlotLagDefault,
		},
	}
}

// Load reads the file at path (none when path is empty), applies the
// environment through getenv (os.Getenv when nil), and resolves it.
func Load(path string, getenv func(string) string) (*Config, error) {
	f, err := LoadFile(path, getenv)
	if err != nil {
		return nil, err
	}
	return f.Resolve()
}

// LoadFile reads the file at path over the defaults and applies the
// environment, without resolving.
func LoadFile(path string, getenv func(string) string) (*File, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	f := Default()
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, keyErr("", "read %s: %v", path, err)
		}
		if err := f.decode(data); err != nil {
			return nil, err
		}
	}
	if err := f.applyEnv(getenv); err != nil {
		return nil, err
	}
	return f, nil
}

// Parse decodes YAML over the defaults and resolves it, without the
// environment.
func Parse(data []byte) (*Config, error) {
	f := Default()
	if err := f.decode(data); err != nil {
		return nil, err
	}
	return f.Resolve()
}

func (c *File) decode(data []byte) error {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return keyErr("", "not valid YAML: %s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if len(root.Content) == 0 {
		return nil // empty file
	}
	return decodeNode("", root.Content[0], reflect.ValueOf(c).Elem())
}

func (c *File) applyEnv(getenv func(string) string) error {
	if v := getenv(EnvDatabaseURL); v != "" {
		c.DatabaseURL = v
	}
	if v := getenv(EnvAdminListen); v != "" {
		c.AdminListen = v
	}
	if v := getenv(EnvAdminToken); v != "" {
		c.AdminToken = v // from a secret store, rather than the file
	}
	if v := getenv(EnvPortalKey); v != "" {
		c.Portal.Key = v
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
	if v := getenv(EnvOutboxMessages); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return keyErr(EnvOutboxMessages, "want true or false, got %q", v)
		}
		c.OutboxMessages = b
	}
	if v := getenv(EnvSigningSecrets); v != "" {
		c.Signing.Secrets = strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' })
	}
	return nil
}

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
