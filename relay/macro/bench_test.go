package macro_test

import (
	"testing"
	"time"

	"github.com/postbox-relay/postbox/relay/macro"
)

// BenchmarkExpandURL expands an affiliate tracker's postback template.
func BenchmarkExpandURL(b *testing.B) {
	tpl, err := macro.Parse("https://track.example/postback?clickid={payload.click_id}&payout={payload.payout}&currency={payload.currency|EUR}&txid={event_id}&sub1={payload.sub1|}", true)
	if err != nil {
		b.Fatal(err)
	}
	v := macro.Values{EventID: "evt_2YzQ8mT3", EventType: "conversion", Endpoint: "network", CreatedAt: time.Now(),
		Payload: []byte(`{"click_id":"clk 7&Hq2","payout":12.5,"sub1":"ü/x"}`)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tpl.ExpandURL(v); err != nil {
			b.Fatal(err)
		}
	}
}
