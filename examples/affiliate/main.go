// Command affiliate records a conversion and its postback in one
// transaction: the network is told about the conversion if and only if the
// conversion is committed. See postbox.yaml beside it for the endpoint, a
// GET postback template.
//
//	POSTBOX_DATABASE_URL=postgres://app@localhost/app go run ./examples/affiliate clk_7Hq2 12.50
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
	if len(os.Args) != 3 {
		log.Fatal("usage: affiliate <click_id> <payout>")
	}
	clickID, payout := os.Args[1], os.Args[2]
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("POSTBOX_DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS conversions (
		id       bigserial   PRIMARY KEY,
		click_id text        NOT NULL UNIQUE,
		payout   numeric     NOT NULL,
		at       timestamptz NOT NULL DEFAULT now())`); err != nil {
		log.Fatal(err)
	}
	var eventID string
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// The business write: a click converts once (the UNIQUE key).
		if _, err := tx.Exec(ctx, `INSERT INTO conversions (click_id, payout) VALUES ($1, $2)`, clickID, payout); err != nil {
			return err
		}
		payload, _ := json.Marshal(map[string]string{"click_id": clickID, "payout": payout, "currency": "EUR"})
		eventID, err = outbox.Insert(ctx, tx, outbox.Event{
			Endpoint: "acme-network",
			Type:     "approved",
			Payload:  payload,
		})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	// Do not log click ids or payouts in production: this prints only
	// what postbox will send as txid.
	fmt.Println("conversion recorded; postback", eventID, "queued")
}
