package outbox_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/postbox-relay/postbox/outbox"
)

var benchBody = []byte(`{"type":"conversion","click_id":"clk_7Hq2","payout":"12.50","currency":"EUR","sub1":"","status":"approved"}`)

// BenchmarkSignatureHeader signs one attempt with two secrets, as during
// a key rotation.
func BenchmarkSignatureHeader(b *testing.B) {
	secrets := benchSecrets(b)
	b.ReportAllocs()
	for b.Loop() {
		_ = outbox.SignatureHeader(secrets, "evt_2YzQ8mT3", 1767225600, benchBody)
	}
}

// BenchmarkVerify checks a request signed by the second of two secrets.
func BenchmarkVerify(b *testing.B) {
	secrets := benchSecrets(b)
	now := time.Unix(1767225600, 0)
	h := http.Header{}
	h.Set("webhook-id", "evt_2YzQ8mT3")
	h.Set("webhook-timestamp", "1767225600")
	h.Set("webhook-signature", outbox.SignatureHeader(secrets[1:], "evt_2YzQ8mT3", now.Unix(), benchBody))
	b.ReportAllocs()
	for b.Loop() {
		if err := outbox.VerifyWith(secrets, 5*time.Minute, h, benchBody, now); err != nil {
			b.Fatal(err)
		}
	}
}

func benchSecrets(b *testing.B) []outbox.Secret {
	var out []outbox.Secret
	for range 2 {
		s, err := outbox.ParseSecret(outbox.NewSecret())
		if err != nil {
			b.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}
