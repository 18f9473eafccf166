package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Verifier checks deliveries' signatures for a receiver.
type Verifier struct {
	secrets []Secret
	// Tolerance is how far webhook-timestamp may be from now either way
	// (DefaultTolerance when zero).
	Tolerance time.Duration
	// MaxBody caps the body Middleware reads (1 MiB when zero).
	MaxBody int64
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// NewVerifier accepts any of the secrets (all of them during a rotation).
func NewVerifier(secrets ...string) (*Verifier, error) {
	v := &Verifier{}
	for _, s := range secrets {
		k, err := ParseSecret(s)
		if err != nil {
			return nil, err
		}
		v.secrets = append(v.secrets, k)
	}
	if len(v.secrets) == 0 {
		return nil, errors.New("webhook: a verifier needs at least one secret")
	}
	return v, nil
}

// Verify checks one delivery: body is what its signature covers, the
// request target for a GET (see SignedContent).
func (v *Verifier) Verify(header http.Header, body []byte) error {
	tol, now := v.Tolerance, time.Now
	if tol == 0 {
		tol = DefaultTolerance
	}
	if v.Now != nil {
		now = v.Now
	}
	return VerifyWith(v.secrets, tol, header, body, now())
}

// Middleware verifies every request before next sees it, a GET over its
// request target. A request that
// fails (missing headers, stale timestamp, no matching signature, body
// too large) gets 401 and never reaches next; next gets the body intact.
func (v *Verifier) Middleware(next http.Handler) http.Handler {
	limit := v.MaxBody
	if limit <= 0 {
		limit = 1 << 20
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
		if err != nil || int64(len(body)) > limit {
			http.Error(w, "unreadable or too large body", http.StatusUnauthorized)
			return
		}
		if err := v.Verify(r.Header, SignedContent(r.Method, r.RequestURI, body)); err != nil {
			http.Error(w, "invalid webhook signature", http.StatusUnauthorized)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

// Deduper remembers webhook-ids so a receiver acts on each event once:
// postbox delivers at least once, and exactly-once is the receiver's
// decision.
type Deduper interface {
	// First records id and reports whether this is its first delivery.
	First(ctx context.Context, id string) (bool, error)
}

// MemoryDeduper remembers ids for a time, in this process only: enough
// to drop a retry's duplicate, not to survive a restart.
type MemoryDeduper struct {
	ttl    time.Duration
	now    func() time.Time
	mu     sync.Mutex
	seen   map[string]time.Time
	writes int
}

// MinDedupTTL is the shortest a MemoryDeduper remembers an id: a signed
// request verifies for DefaultTolerance either side of its timestamp, so
// an id forgotten sooner could be replayed while it still verifies.
const MinDedupTTL = 2 * DefaultTolerance

// NewMemoryDeduper remembers each id for ttl, at least MinDedupTTL.
func NewMemoryDeduper(ttl time.Duration) *MemoryDeduper {
	return &MemoryDeduper{ttl: max(ttl, MinDedupTTL), now: time.Now, seen: map[string]time.Time{}}
}

// First implements Deduper.
func (d *MemoryDeduper) First(_ context.Context, id string) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	if until, ok := d.seen[id]; ok && now.Before(until) {
		return false, nil
	}
	d.seen[id] = now.Add(d.ttl)
	if d.writes++; d.writes%1024 == 0 {
		for k, until := range d.seen {
			if !now.Before(until) {
				delete(d.seen, k)
			}
		}
	}
	return true, nil
}

// DefaultReceiptsTable is where TxDeduper records webhook-ids.
const DefaultReceiptsTable = "webhook_receipts"

// ReceiptsSchemaSQL creates the table TxDeduper uses.
func ReceiptsSchemaSQL(table string) string {
	return `CREATE TABLE IF NOT EXISTS ` + pgx.Identifier{table}.Sanitize() + ` (
  webhook_id  text        PRIMARY KEY,
  received_at timestamptz NOT NULL DEFAULT now()
)`
}

// TxDeduper records webhook-ids with INSERT … ON CONFLICT DO NOTHING in
// the receiver's own transaction (a pgx.Tx or *sql.Tx): the id is stored
// if and only if the business effect commits with it, so a delivery whose
// handling failed is handled again, and one that succeeded is dropped.
type TxDeduper struct {
	Tx    any    // pgx.Tx or *sql.Tx
	Table string // DefaultReceiptsTable when empty
}

// First implements Deduper.
func (d TxDeduper) First(ctx context.Context, id string) (bool, error) {
	table := d.Table
	if table == "" {
		table = DefaultReceiptsTable
	}
	q := `INSERT INTO ` + pgx.Identifier{table}.Sanitize() + ` (webhook_id) VALUES ($1) ON CONFLICT DO NOTHING`
	var n int64
	switch tx := d.Tx.(type) {
	case PgxExecer:
		tag, err := tx.Exec(ctx, q, id)
		if err != nil {
			return false, fmt.Errorf("webhook receipts: %w", err)
		}
		n = tag.RowsAffected()
	case SQLExecer:
		res, err := tx.ExecContext(ctx, q, id)
		if err != nil {
			return false, fmt.Errorf("webhook receipts: %w", err)
		}
		n, _ = res.RowsAffected()
	default:
		return false, ErrNotExecer
	}
	return n == 1, nil
}
