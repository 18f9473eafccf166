package outbox_test

import (
	"context"
	"encoding/json"
	"log"
	"net/http"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-relay/postbox/outbox"
)

// The examples below hold the Go snippets of the README and docs/, line
// for line (TestDocsGoSnippetsAreExamples checks that each snippet is in
// one), so that what the docs show compiles.

// examplePool connects to the application's database.
func examplePool(ctx context.Context) *pgxpool.Pool {
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	return pool
}

// exampleTx begins the application's business transaction.
func exampleTx(ctx context.Context) pgx.Tx {
	tx, err := examplePool(ctx).Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	return tx
}

// The README's "Integrating in ten lines" and docs/integration.md,
// "Go (pgx or database/sql)": the event is written in the business
// transaction, and delivered if and only if it commits.
func ExampleInsert() {
	ctx := context.Background()
	pool := examplePool(ctx)
	clickID, payout := "clk_7Hq2", "12.50"

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO conversions (click_id, payout) VALUES ($1, $2)`, clickID, payout); err != nil {
			return err
		}
		_, err := outbox.Insert(ctx, tx, outbox.Event{Endpoint: "acme_network", Type: "conversion",
			Payload: json.RawMessage(`{"click_id":"clk_7Hq2","payout":"12.50"}`)})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
}

// docs/integration.md, "Another outbox table": outbox.Insert writes
// postbox.outbox; a relay configured with another outbox_table reads
// that one, and the application writes it through its Table.
func ExampleTable_Insert() {
	ctx := context.Background()
	tx := exampleTx(ctx)
	defer tx.Rollback(ctx)
	payload := json.RawMessage(`{"click_id":"clk_7Hq2"}`)

	table, err := outbox.ParseTable("app.events_outbox") // the relay's outbox_table
	if err != nil {
		log.Fatal(err)
	}
	id, err := table.Insert(ctx, tx, outbox.Event{Endpoint: "acme_network", Payload: payload})
	if err != nil {
		log.Fatal(err)
	}
	log.Println("event", id)
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
}

// docs/integration.md, "Without a table: outbox.Emit".
func ExampleEmit() {
	ctx := context.Background()
	tx := exampleTx(ctx)
	defer tx.Rollback(ctx)
	payload := json.RawMessage(`{"click_id":"clk_7Hq2"}`)

	id, err := outbox.Emit(ctx, tx, outbox.Event{Endpoint: "partner-a", Type: "conversion", Payload: payload})
	if err != nil {
		log.Fatal(err)
	}
	log.Println("event", id)
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
}

// The README and docs/integration.md, "Go": a receiver that verifies
// every delivery's signature before its handler sees it.
func ExampleVerifier_Middleware() {
	secrets := strings.Split(os.Getenv("WEBHOOK_SECRETS"), ",")
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("webhook-id") // drop a duplicate by it
		log.Println("delivered", id)
	})

	v, err := outbox.NewVerifier(secrets...) // "whsec_…", every active one
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("/webhooks", v.Middleware(handler))
	log.Fatal(http.ListenAndServe(":8080", nil))
}
