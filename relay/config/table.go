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
	mu   sync.RWMutex
	eps  map[string]*tableEntry
	subs subIndex // the enabled endpoints' subscriptions (Subscribers)
	// parse parses a row kept as text (ParseRowsWith).
	parse func(row []byte) TableEndpoint
	// invalid, when set, names the invalid endpoints as whoever keeps
	// the table computes them (KeepInvalid).
	invalid atomic.Pointer[func() []string]
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

// tableEntry is one row applied. A row given as its columns' text
// (ApplyRow, ReplaceWith) is kept so, about 150 bytes, and parsed again
// when asked for (its resolution is kept once its events are attempted):
// 100,000 rows kept parsed took 85 MB, a heap the collector marks again
// and again. A row given parsed (Apply) is kept parsed.
type tableEntry struct {
	revision int64
	te       *TableEndpoint
	row      []byte
	cache    atomic.Pointer[tableResolved]
}

// tableResolved is an entry resolved under one configuration: reloading
// the file resolves each entry again when it is next looked up.
type tableResolved struct {
	cfg *Config
	ep  Endpoint
}

// NewEndpointTable returns an empty table.
func NewEndpointTable() *EndpointTable {
	return &EndpointTable{eps: map[string]*tableEntry{}, subs: newSubIndex()}
}

// ParseRowsWith has the table keep the rows given as text (ApplyRow,
// ReplaceWith) as text, parsed by parse when asked for; without it they
// are kept parsed.
func (t *EndpointTable) ParseRowsWith(parse func(row []byte) TableEndpoint) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.parse = parse
}

// newEntry keeps te, or row when it is given and the table can parse it.
func (t *EndpointTable) newEntry(te TableEndpoint, row []byte) *tableEntry {
	e := &tableEntry{revision: te.Revision}
	if row != nil && t.parse != nil {
		e.row = row
	} else {
		e.te = &te
	}
	return e
}

// tableEndpoint is the row e keeps, parsed.
func (t *EndpointTable) tableEndpoint(e *tableEntry) TableEndpoint {
	if e.te != nil {
		return *e.te
	}
	return t.parse(e.row)
}

// Apply puts te in, unless the table holds a later revision of it.
func (t *EndpointTable) Apply(te TableEndpoint) { t.ApplyRow(te, nil) }

// ApplyRow is Apply of te parsed from row, the row's columns as text,
// which the table keeps instead of te when it can parse it again
// (ParseRowsWith).
func (t *EndpointTable) ApplyRow(te TableEndpoint, row []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur, ok := t.eps[te.Name]
	if ok && cur.revision > te.Revision {
		return
	}
	if ok {
		old := t.tableEndpoint(cur)
		t.subs.remove(&old)
	}
	t.eps[te.Name] = t.newEntry(te, row)
	t.subs.add(&te)
}

// Remove takes name out, unless the table holds a revision of it later
// than revision (a row inserted again after the delete being applied).
func (t *EndpointTable) Remove(name string, revision int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if cur, ok := t.eps[name]; ok && cur.revision <= revision {
		old := t.tableEndpoint(cur)
		t.subs.remove(&old)
		delete(t.eps, name)
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
	m := map[string]*tableEntry{}
	subs := newSubIndex()
	err := fill(func(te TableEndpoint, row []byte) {
		if cur, ok := m[te.Name]; ok {
			old := t.tableEndpoint(cur)
			subs.remove(&old)
		}
		m[te.Name] = t.newEntry(te, row)
		subs.add(&te)
	})
	if err != nil {
		return err
	}
	t.mu.Lock()
	t.eps, t.subs = m, subs
	t.mu.Unlock()
	return nil
}

// Get returns the row applied for name.
func (t *EndpointTable) Get(name string) (TableEndpoint, bool) {
	e := t.entry(name)
	if e == nil {
		return TableEndpoint{}, false
	}
	return t.tableEndpoint(e), true
}

// Has reports whether the table holds name.
func (t *EndpointTable) Has(name string) bool { return t.entry(name) != nil }

// Revision is the revision applied for name (0 when there is none).
func (t *EndpointTable) Revision(name string) int64 {
	if e := t.entry(name); e != nil {
		return e.revision
	}
	return 0
}

func (t *EndpointTable) entry(name string) *tableEntry {
	if t == nil {
		return nil
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.eps[name]
}

// Len is how many endpoints the table holds.
func (t *EndpointTable) Len() int {
	if t == nil {
		return 0
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.eps)
}

// Names are the table's endpoint names, sorted.
func (t *EndpointTable) Names() []string {
	if t == nil {
		return nil
	}
	t.mu.RLock()
	names := make([]string, 0, len(t.eps))
	for n := range t.eps {
		names = append(names, n)
	}
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
	for _, e := range t.eps {
		f(t.tableEndpoint(e))
	}
}

// tableEndpoint is name's settings from the table, resolved under c
// (cached per configuration), and whether the table has it.
func (c *Config) tableEndpoint(name string) (Endpoint, bool) {
	e := c.EndpointTable.entry(name)
	if e == nil {
		return Endpoint{}, false
	}
	if r := e.cache.Load(); r != nil && r.cfg == c {
		return r.ep, true
	}
	ep := c.resolveTable(c.EndpointTable.tableEndpoint(e))
	e.cache.Store(&tableResolved{cfg: c, ep: ep})
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
