// Command producer is an application writing a postback the postbox way:
// the business row and the outbox row in one transaction, so the postback
// is sent if and only if the conversion is committed.
//
//	POSTBOX_DATABASE_URL=postgres://app@localhost/app go run ./examples/producer
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-relay/postbox/outbox"
)

func main() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("POSTBOX_DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// Normally part of the application's migrations (with outbox/schema.sql,
	// or `postbox migrate`).
	if _, err := pool.Exec(ctx, outbox.SchemaSQL(mustTable(outbox.DefaultTable))+`;
		CREATE TABLE IF NOT EXISTS conversions (
		  id       bigserial PRIMARY KEY,
		  click_id text    NOT NULL,
		  payout   numeric NOT NULL
		)`); err != nil {
		log.Fatal(err)
	}

	var eventID string
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO conversions (click_id, payout) VALUES ($1, $2) RETURNING id`,
			"clk_7Hq2", "12.50").Scan(&id); err != nil {
			return err
		}
		payload, _ := json.Marshal(map[string]any{"conversion_id": id, "click_id": "clk_7Hq2", "payout": "12.50"})
		eventID, err = outbox.Insert(ctx, tx, outbox.Event{
			Endpoint: "partner-42",
			Type:     "conversion.approved",
			Payload:  payload,
		})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("committed conversion and postback", eventID)
}

func mustTable(s string) outbox.Table {
	t, err := outbox.ParseTable(s)
	if err != nil {
		log.Fatal(err)
	}
	return t
}
