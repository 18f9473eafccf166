package config

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/postbox-relay/postbox/outbox"
)

// Where an endpoint's settings come from (Endpoint.Source).
const (
	SourceDefaults = ""      // not configured: the defaults
	SourceFile     = "file"  // the configuration file's endpoints
	SourceTable    = "table" // a row of postbox.endpoints
)

// TableEndpoint is a row of postbox.endpoints as parsed (relay/internal
// reads the row; this package resolves it against the defaults): its
// settings as a file's endpoint would write them, and what only a row
// has. Invalid says why the row cannot be used as written (a value that
// does not parse); its events wait until a corrected row arrives.
type TableEndpoint struct {
	Name     string
	Settings EndpointConfig
	Enabled  bool
	// EventTypes are the event types the endpoint subscribes to: exact
	// names, or "prefix.*" for every type below prefix. Filter, when not
	// nil, is a JSON object the payload must contain.
	EventTypes []string
	Filter     []byte
	// Secret names a secret the configuration declares (signing.named);
	// "" signs with the secret derived for the endpoint, of
	// SecretVersion, the previous version too until PreviousSecretUntil.
	Secret              string
	SecretVersion       int
	PreviousSecretUntil time.Time
	Revision            int64
	Invalid             string
}

// EndpointTable is the endpoints of postbox.endpoints as this instance applied
// them, safe for concurrent use. A change replaces one entry: the others
// keep their resolution (see Config.Endpoint).
type EndpointTable struct {
	mu sync.RWMutex
	// rows are the rows applied, as text when the table can parse them
	// again (ParseRowsWith): about 150 bytes each, parsed when asked for,
	// in a store the collector does not scan (see rowStore). Rows given
	// parsed are in parsed (tests, and tools that read a table whole).
	rows   *rowStore
	parsed map[string]*TableEndpoint
	subs   subIndex // the enabled endpoints' subscriptions (Subscribers)
	// parse parses a row kept as text (ParseRowsWith).
	parse func(row []byte) TableEndpoint
	// invalid, when set, names the invalid endpoints as whoever keeps
	// the table computes them (KeepInvalid).
	invalid atomic.Pointer[func() []string]

	// resolved holds the resolutions of the endpoints looked up (those
	// whose events are attempted), not of every row; a change of a row
	// drops its own.
	resolvedMu sync.Mutex
	resolved   map[string]*tableResolved
	// changes counts the changes applied (under mu): a resolution is kept
	// only when none came between its read and its end.
	changes uint64
}

// KeepInvalid has Invalid answer with f: the keeper of the table knows
// its invalid rows as changes are applied, where computing them afresh
// resolves every row.
func (t *EndpointTable) KeepInvalid(f func() []string) { t.invalid.Store(&f) }

// Invalid names the table's invalid endpoints as its keeper computes
// them, sorted, and whether it has a keeper.
func (t *EndpointTable) Invalid() ([]string, bool) {
	if t == nil {
		return nil, false
	}
	f := t.invalid.Load()
	if f == nil {
		return nil, false
	}
	return (*f)(), true
}

// tableResolved is a row of a revision resolved under one configuration:
// reloading the file resolves each row again when it is next looked up.
type tableResolved struct {
	cfg      *Config
	revision int64
	ep       Endpoint
}

// NewEndpointTable returns an empty table.
func NewEndpointTable() *EndpointTable {
	return &EndpointTable{rows: newRowStore(0), parsed: map[string]*TableEndpoint{}, subs: newSubIndex(),
		resolved: map[string]*tableResolved{}}
}

// ParseRowsWith has the table keep the rows given as text (ApplyRow,
// ReplaceWith) as text, parsed by parse when asked for; without it they
// are kept parsed.
func (t *EndpointTable) ParseRowsWith(parse func(row []byte) TableEndpoint) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.parse = parse
}

// put keeps te, as row when it is given and the table can parse it, in
// rows and parsed.
func (t *EndpointTable) put(rows *rowStore, parsed map[string]*TableEndpoint, te TableEndpoint, row []byte) {
	if row != nil && t.parse != nil {
		rows.put(te.Name, row, te.Revision, false)
		delete(parsed, te.Name)
		return
	}
	rows.put(te.Name, nil, te.Revision, true)
	parsed[te.Name] = &te
}

// tableEndpoint is the row of slot i, parsed; t.mu is held.
func (t *EndpointTable) tableEndpoint(rows *rowStore, parsed map[string]*TableEndpoint, i int32) TableEndpoint {
	if rows.slots[i].parsed {
		return *parsed[rows.name(i)]
	}
	return t.parse(rows.row(i))
}

// forget drops name's resolution.
func (t *EndpointTable) forget(name string) {
	t.resolvedMu.Lock()
	delete(t.resolved, name)
	t.resolvedMu.Unlock()
}

// Apply puts te in, unless the table holds a later revision of it.
func (t *EndpointTable) Apply(te TableEndpoint) { t.ApplyRow(te, nil) }

// ApplyRow is Apply of te parsed from row, the row's columns as text,
// which the table keeps instead of te when it can parse it again
// (ParseRowsWith).
func (t *EndpointTable) ApplyRow(te TableEndpoint, row []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	i, _, ok := t.rows.find(te.Name)
	if ok && t.rows.slots[i].revision > te.Revision {
		return
	}
	if ok {
		old := t.tableEndpoint(t.rows, t.parsed, i)
		t.subs.remove(&old)
	}
	t.put(t.rows, t.parsed, te, row)
	t.subs.add(&te)
	t.changes++
	t.forget(te.Name)
}

// Remove takes name out, unless the table holds a revision of it later
// than revision (a row inserted again after the delete being applied).
func (t *EndpointTable) Remove(name string, revision int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i, _, ok := t.rows.find(name); ok && t.rows.slots[i].revision <= revision {
		old := t.tableEndpoint(t.rows, t.parsed, i)
		t.subs.remove(&old)
		t.rows.remove(name)
		delete(t.parsed, name)
		t.changes++
		t.forget(name)
	}
}

// Replace makes the table hold exactly eps (a whole copy read afresh).
func (t *EndpointTable) Replace(eps []TableEndpoint) {
	_ = t.ReplaceWith(func(add func(TableEndpoint, []byte)) error {
		for _, te := range eps {
			add(te, nil)
		}
		return nil
	})
}

// ReplaceWith makes the table hold exactly what fill adds (as ApplyRow
// takes it; row may be nil), unless fill fails: the rows are parsed one
// at a time as they are read, never all held in a slice beside the
// table.
func (t *EndpointTable) ReplaceWith(fill func(add func(te TableEndpoint, row []byte)) error) error {
	rows, parsed := newRowStore(0), map[string]*TableEndpoint{}
	subs := newSubIndex()
	err := fill(func(te TableEndpoint, row []byte) {
		if i, _, ok := rows.find(te.Name); ok {
			old := t.tableEndpoint(rows, parsed, i)
			subs.remove(&old)
		}
		t.put(rows, parsed, te, row)
		subs.add(&te)
	})
	if err != nil {
		return err
	}
	t.mu.Lock()
	t.rows, t.parsed, t.subs = rows, parsed, subs
	t.changes++
	t.resolvedMu.Lock()
	t.resolved = map[string]*tableResolved{}
	t.resolvedMu.Unlock()
	t.mu.Unlock()
	return nil
}

// Get returns the row applied for name.
func (t *EndpointTable) Get(name string) (TableEndpoint, bool) {
	if t == nil {
		return TableEndpoint{}, false
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	i, _, ok := t.rows.find(name)
	if !ok {
		return TableEndpoint{}, false
	}
	return t.tableEndpoint(t.rows, t.parsed, i), true
}

// Has reports whether the table holds name.
func (t *EndpointTable) Has(name string) bool {
	_, ok := t.revision(name)
	return ok
}

// Revision is the revision applied for name (0 when there is none).
func (t *EndpointTable) Revision(name string) int64 {
	rev, _ := t.revision(name)
	return rev
}

// revision is name's revision applied, and whether the table has it.
func (t *EndpointTable) revision(name string) (int64, bool) {
	if t == nil {
		return 0, false
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	i, _, ok := t.rows.find(name)
	if !ok {
		return 0, false
	}
	return t.rows.slots[i].revision, true
}

// Len is how many endpoints the table holds.
func (t *EndpointTable) Len() int {
	if t == nil {
		return 0
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.rows.used
}

// Names are the table's endpoint names, sorted.
func (t *EndpointTable) Names() []string {
	if t == nil {
		return nil
	}
	t.mu.RLock()
	names := make([]string, 0, t.rows.used)
	t.rows.each(func(i int32) { names = append(names, t.rows.name(i)) })
	t.mu.RUnlock()
	sort.Strings(names)
	return names
}

// Each calls f for every row applied, in no order, under the table's
// read lock: f must not change the table.
func (t *EndpointTable) Each(f func(TableEndpoint)) {
	if t == nil {
		return
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	t.rows.each(func(i int32) { f(t.tableEndpoint(t.rows, t.parsed, i)) })
}

// tableEndpoint is name's settings from the table, resolved under c
// (kept per configuration and revision), and whether the table has it.
func (c *Config) tableEndpoint(name string) (Endpoint, bool) {
	t := c.EndpointTable
	if t == nil {
		return Endpoint{}, false
	}
	t.mu.RLock()
	i, _, ok := t.rows.find(name)
	if !ok {
		t.mu.RUnlock()
		return Endpoint{}, false
	}
	rev, changes := t.rows.slots[i].revision, t.changes
	t.resolvedMu.Lock()
	r := t.resolved[name]
	t.resolvedMu.Unlock()
	if r != nil && r.cfg == c && r.revision == rev {
		t.mu.RUnlock()
		return r.ep, true
	}
	te := t.tableEndpoint(t.rows, t.parsed, i)
	t.mu.RUnlock()
	ep := c.resolveTable(te)
	t.mu.RLock()
	// Kept only while the row resolved is still the one applied: a change
	// applied meanwhile dropped name's resolution, and must not find it
	// again.
	if t.changes == changes {
		t.resolvedMu.Lock()
		t.resolved[name] = &tableResolved{cfg: c, revision: rev, ep: ep}
		t.resolvedMu.Unlock()
	}
	t.mu.RUnlock()
	return ep, true
}

// ResolveTableEndpoint resolves te under c as Endpoint would, without
// keeping the resolution.
func (c *Config) ResolveTableEndpoint(te TableEndpoint) Endpoint { return c.resolveTable(te) }

// ReservedHeaders are the headers postbox sets itself: a row of
// postbox.endpoints that sets one is invalid (the file's endpoints keep
// theirs, as before).
var ReservedHeaders = []string{"webhook-id", "webhook-timestamp", "webhook-signature", "content-type", "content-length", "host", "user-agent", "transfer-encoding", "connection"}

// resolveTable resolves a table row against the defaults, except their
// headers and secrets: whoever may write a row could point it at a host
// of their own, and must not receive the operator's credentials there.
// A row that does not resolve keeps its name and reason (Invalid).
func (c *Config) resolveTable(te TableEndpoint) Endpoint {
	base := c.Defaults
	base.Headers, base.AllowRowURL = nil, false
	base.Secrets, base.OwnSecrets = c.Secrets, false
	invalid := func(reason string) Endpoint {
		ep := base
		ep.Name, ep.Configured, ep.Source, ep.Revision = te.Name, true, SourceTable, te.Revision
		ep.Disabled, ep.Invalid = !te.Enabled, reason
		return ep
	}
	if te.Invalid != "" {
		return invalid(te.Invalid)
	}
	settings := te.Settings
	settings.Secrets, settings.SecretsFile = nil, nil
	for k := range settings.Headers {
		if slices.Contains(ReservedHeaders, strings.ToLower(k)) {
			return invalid(fmt.Sprintf("headers: %s is set by postbox", k))
		}
	}
	ep, err := resolveEndpoint("endpoints "+strconv.Quote(te.Name), base, settings, skipSecretsFile)
	if err != nil {
		msg := err.Error()
		if e, ok := err.(*Error); ok {
			msg = strings.TrimPrefix(e.Key, "endpoints "+strconv.Quote(te.Name)+".") + ": " + e.Msg
		}
		return invalid(msg)
	}
	ep.Name, ep.Configured, ep.Source, ep.Revision = te.Name, true, SourceTable, te.Revision
	ep.Disabled = !te.Enabled
	ep.SecretVersion, ep.PreviousSecretUntil = max(te.SecretVersion, 1), te.PreviousSecretUntil
	if te.Secret != "" {
		named, ok := c.NamedSecrets[te.Secret]
		if !ok {
			return invalid(fmt.Sprintf("secret: no secret %q is declared under signing.named", te.Secret))
		}
		ep.Secrets, ep.OwnSecrets = named, true
	}
	return ep
}

// Conflicts are the names defined both in the file and in the table: the
// file's settings are used for them.
func (c *Config) Conflicts() []string {
	var out []string
	for _, n := range c.EndpointTable.Names() {
		if _, ok := c.Endpoints[n]; ok {
			out = append(out, n)
		}
	}
	return out
}

// derivedLabel is the label a table endpoint's secret of version v is
// derived for: its name, then name/v.
func derivedLabel(name string, v int) string {
	if v <= 1 {
		return name
	}
	return name + "/" + strconv.Itoa(v)
}

// tableSecrets are a table endpoint's derived secrets at now: of its
// version under each master, then of the previous version while
// previous_secret_until has not passed.
func tableSecrets(ep Endpoint, now time.Time) []outbox.Secret {
	out := DeriveSecrets(ep.Secrets, derivedLabel(ep.Name, ep.SecretVersion))
	if ep.SecretVersion > 1 && now.Before(ep.PreviousSecretUntil) {
		out = append(out, DeriveSecrets(ep.Secrets, derivedLabel(ep.Name, ep.SecretVersion-1))...)
	}
	return out
}
