// Command receiver is a service that receives postbox deliveries: it
// verifies the Standard Webhooks signature (401 otherwise) and acts on each
// event once, recording its webhook-id in the same transaction as the
// business effect, so a retried or replayed delivery is dropped.
//
//	RECEIVER_SECRETS=whsec_… DATABASE_URL=postgres://app@localhost/app go run ./examples/receiver
//
// RECEIVER_SECRETS may list several secrets (comma-separated) during a
// rotation.
package main

import (
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-relay/postbox/outbox"
)

func main() {
	verifier, err := outbox.NewVerifier(strings.Split(os.Getenv("RECEIVER_SECRETS"), ",")...)
	if err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(context.Background(), outbox.ReceiptsSchemaSQL(outbox.DefaultReceiptsTable)+`;
		CREATE TABLE IF NOT EXISTS orders_seen (event_id text PRIMARY KEY, body jsonb NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	handle := func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body) // the middleware verified it, and kept it for us
		if !json.Valid(body) {
			body = []byte(`{}`)
		}
		id := r.Header.Get(outbox.HeaderID)
		var first bool
		err := pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error {
			var err error
			if first, err = (outbox.TxDeduper{Tx: tx}).First(r.Context(), id); err != nil || !first {
				return err
			}
			// The business effect, in the same transaction as the receipt.
			_, err = tx.Exec(r.Context(), `INSERT INTO orders_seen (event_id, body) VALUES ($1, $2)`, id, body)
			return err
		})
		if err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable) // postbox retries
			return
		}
		if !first {
			log.Printf("duplicate %s dropped", id)
		}
		w.WriteHeader(http.StatusNoContent)
	}
	http.Handle("POST /webhooks", verifier.Middleware(http.HandlerFunc(handle)))
	addr := ":8080"
	if a := os.Getenv("LISTEN"); a != "" {
		addr = a
	}
	log.Printf("receiving on %s", addr)
	log.Fatal(http.ListenAndServe(addr, nil))
}
