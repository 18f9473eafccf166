package outbox_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
)

// FuzzVerify verifies fuzzed deliveries: a fuzzed webhook-signature header
// is accepted only when it carries the signature Verify computes itself;
// the delivery signed with the secret, among fuzzed entries, is accepted;
// once one byte of its body, webhook-id or webhook-timestamp changes, or
// the secret does, it is not.
func FuzzVerify(f *testing.F) {
	f.Fuzz(func(t *testing.T, secret, id string, ts int64, body []byte, sigs string, mutate uint) {
		now := time.Unix(ts, 0)
		header := func(id, tsText, sigs string) http.Header {
			h := http.Header{}
			h.Set(outbox.HeaderID, id)
			h.Set(outbox.HeaderTimestamp, tsText)
			h.Set(outbox.HeaderSignature, sigs)
			return h
		}
		tsText := strconv.FormatInt(ts, 10)
		sec, err := outbox.ParseSecret(secret)
		if err != nil {
			err := outbox.Verify([]string{secret}, header(id, tsText, sigs), body, now)
			require.ErrorIs(t, err, outbox.ErrInvalidSecret)
			return
		}

		// Fuzzed entries alone: accepted only when one of them is the
		// signature itself.
		want, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(sec.Sign(id, ts, body), "v1,"))
		require.NoError(t, err)
		if err := outbox.Verify([]string{secret}, header(id, tsText, sigs), body, now); err == nil {
			require.True(t, carries(sigs, want), "%q was accepted without the signature", sigs)
		} else {
			require.True(t, isVerifyError(err), "%v", err)
		}

		if id == "" {
			err := outbox.Verify([]string{secret}, header(id, tsText, sec.Sign(id, ts, body)), body, now)
			require.ErrorIs(t, err, outbox.ErrMissingHeaders)
			return
		}
		signed := sigs + " " + sec.Sign(id, ts, body)
		require.NoError(t, outbox.Verify([]string{secret}, header(id, tsText, signed), body, now),
			"the signature among other entries")

		// One byte changed, or another secret: refused.
		flip := func(s []byte) []byte {
			out := bytes.Clone(s)
			out[int(mutate/4)%len(out)] ^= byte(mutate>>8) | 1
			return out
		}
		mBody, mID, mTS := body, id, tsText
		switch mutate % 4 {
		case 0:
			if len(body) == 0 {
				return
			}
			mBody = flip(body)
		case 1:
			mID = string(flip([]byte(id)))
		case 2:
			mTS = string(flip([]byte(tsText)))
		case 3:
			other, err := outbox.ParseSecret(base64.StdEncoding.EncodeToString(flip(keyOf(t, secret))))
			require.NoError(t, err)
			otherSig, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(other.Sign(id, ts, body), "v1,"))
			require.NoError(t, err)
			if carries(sigs, otherSig) {
				return // the fuzzed entries hold the other secret's signature: rightly accepted
			}
			err = outbox.VerifyWith([]outbox.Secret{other}, outbox.DefaultTolerance, header(id, tsText, signed), body, now)
			require.Error(t, err, "another secret")
			return
		}
		if mts, err := strconv.ParseInt(mTS, 10, 64); err == nil {
			mSig, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(sec.Sign(mID, mts, mBody), "v1,"))
			require.NoError(t, err)
			if carries(sigs, mSig) {
				return // the fuzzed entries hold the changed delivery's own signature: rightly accepted
			}
		}
		err = outbox.Verify([]string{secret}, header(mID, mTS, signed), mBody, now)
		require.Error(t, err, "id %q timestamp %q body %q", mID, mTS, mBody)
		require.True(t, isVerifyError(err), "%v", err)
	})
}

// carries reports whether the webhook-signature value sigs has a v1
// entry whose signature is want.
func carries(sigs string, want []byte) bool {
	for _, entry := range strings.Fields(sigs) {
		version, sig, _ := strings.Cut(entry, ",")
		if got, err := base64.StdEncoding.DecodeString(sig); err == nil && version == "v1" && bytes.Equal(got, want) {
			return true
		}
	}
	return false
}

// keyOf is the key of a secret ParseSecret accepted.
func keyOf(t *testing.T, secret string) []byte {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(strings.TrimSpace(secret), outbox.SecretPrefix))
	require.NoError(t, err)
	return key
}

func isVerifyError(err error) bool {
	for _, e := range []error{outbox.ErrMissingHeaders, outbox.ErrInvalidTimestamp, outbox.ErrTimestampTooOld,
		outbox.ErrTimestampFuture, outbox.ErrNoMatch} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
