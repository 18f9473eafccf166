package outbox_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

type vectors struct {
	Secret    string `json:"secret"`
	MsgID     string `json:"msg_id"`
	Timestamp int64  `json:"timestamp"`
	Payload   string `json:"payload"`
	Signature string `json:"signature"`
	Cases     []struct {
		Name       string `json:"name"`
		Secret     string `json:"secret"`
		DropHeader string `json:"drop_header"`
		Signature  string `json:"signature"`
		Payload    string `json:"payload"`
		NowOffset  int64  `json:"now_offset_seconds"`
		Valid      bool   `json:"valid"`
	} `json:"cases"`
}

func loadVectors(t *testing.T) vectors {
	t.Helper()
	data, err := os.ReadFile("../testdata/standardwebhooks/vectors.json")
	require.NoError(t, err)
	var v vectors
	require.NoError(t, json.Unmarshal(data, &v))
	return v
}

// TestStandardWebhooksVectors checks signing and verification against the
// specification's published vector and cases.
func TestStandardWebhooksVectors(t *testing.T) {
	t.Parallel()
	v := loadVectors(t)
	secret, err := outbox.ParseSecret(v.Secret)
	require.NoError(t, err)
	require.Equal(t, v.Signature, secret.Sign(v.MsgID, v.Timestamp, []byte(v.Payload)), "the published signature")

	for _, c := range v.Cases {
		h := http.Header{}
		h.Set(outbox.HeaderID, v.MsgID)
		h.Set(outbox.HeaderTimestamp, strconv.FormatInt(v.Timestamp, 10))
		h.Set(outbox.HeaderSignature, v.Signature)
		if c.Signature != "" {
			h.Set(outbox.HeaderSignature, c.Signature)
		}
		if c.DropHeader != "" {
			h.Del(c.DropHeader)
		}
		payload, sec := v.Payload, v.Secret
		if c.Payload != "" {
			payload = c.Payload
		}
		if c.Secret != "" {
			sec = c.Secret
		}
		now := time.Unix(v.Timestamp+c.NowOffset, 0)
		err := outbox.Verify([]string{sec}, h, []byte(payload), now)
		if c.Valid {
			require.NoError(t, err, c.Name)
		} else {
			require.Error(t, err, c.Name)
		}
	}
}

func TestMiddlewareRejectsWith401(t *testing.T) {
	t.Parallel()
	s1, s2 := outbox.NewSecret(), outbox.NewSecret()
	v, err := outbox.NewVerifier(s1, s2)
	require.NoError(t, err)
	var got []byte
	srv := httptest.NewServer(v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
		w.WriteHeader(http.StatusNoContent)
	})))
	defer srv.Close()
	send := func(secret string, body string, ts int64) int {
		k, err := outbox.ParseSecret(secret)
		require.NoError(t, err)
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
		req.Header.Set(outbox.HeaderID, "evt_1")
		req.Header.Set(outbox.HeaderTimestamp, strconv.FormatInt(ts, 10))
		req.Header.Set(outbox.HeaderSignature, outbox.SignatureHeader([]outbox.Secret{k}, "evt_1", ts, []byte(body)))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	now := time.Now().Unix()
	require.Equal(t, http.StatusNoContent, send(s1, `{"a":1}`, now))
	require.Equal(t, `{"a":1}`, string(got), "the handler gets the body intact")
	require.Equal(t, http.StatusNoContent, send(s2, `{"a":1}`, now), "either secret during a rotation")
	require.Equal(t, http.StatusUnauthorized, send(outbox.NewSecret(), `{"a":1}`, now), "wrong secret")
	require.Equal(t, http.StatusUnauthorized, send(s1, `{"a":1}`, now-400), "stale")
	require.Equal(t, http.StatusUnauthorized, send(s1, `{"a":1}`, now+400), "future")
}

func TestMemoryDeduper(t *testing.T) {
	t.Parallel()
	d := outbox.NewMemoryDeduper(time.Hour)
	first, _ := d.First(context.Background(), "evt_1")
	require.True(t, first)
	again, _ := d.First(context.Background(), "evt_1")
	require.False(t, again)
	other, _ := d.First(context.Background(), "evt_2")
	require.True(t, other)
}

// TestTxDeduperFollowsTheReceiversTransaction: the id is recorded only if
// the receiver's transaction commits.
func TestTxDeduperFollowsTheReceiversTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.NewDatabase(t))
	require.NoError(t, err)
	defer pool.Close()
	_, err = pool.Exec(ctx, outbox.ReceiptsSchemaSQL(outbox.DefaultReceiptsTable))
	require.NoError(t, err)
	handle := func(id string, fail bool) (bool, error) {
		var first bool
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			first, err = outbox.TxDeduper{Tx: tx}.First(ctx, id)
			if err != nil || !first {
				return err
			}
			if fail {
				return io.ErrUnexpectedEOF // the business effect failed: roll back
			}
			return nil
		})
		return first, err
	}
	first, err := handle("evt_1", true)
	require.True(t, first)
	require.Error(t, err)
	first, err = handle("evt_1", false)
	require.NoError(t, err)
	require.True(t, first, "the failed handling did not record the id")
	first, err = handle("evt_1", false)
	require.NoError(t, err)
	require.False(t, first, "a duplicate is dropped")
}

// A GET postback is signed over its request target: the middleware lets
// it through as sent and refuses it with another payout or without its
// query.
func TestMiddlewareVerifiesGetPostbacksOverTheirTarget(t *testing.T) {
	secret := outbox.NewSecret()
	v, err := outbox.NewVerifier(secret)
	require.NoError(t, err)
	key, err := outbox.ParseSecret(secret)
	require.NoError(t, err)
	h := v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	const target = "/pb?click_id=c1&payout=12.50"
	ts := time.Now().Unix()
	sig := outbox.SignatureHeader([]outbox.Secret{key}, "msg_1", ts, outbox.SignedContent(http.MethodGet, target, nil))
	send := func(target string) int {
		r := httptest.NewRequest(http.MethodGet, target, nil)
		r.Header.Set(outbox.HeaderID, "msg_1")
		r.Header.Set(outbox.HeaderTimestamp, strconv.FormatInt(ts, 10))
		r.Header.Set(outbox.HeaderSignature, sig)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	require.Equal(t, http.StatusNoContent, send(target))
	require.Equal(t, http.StatusUnauthorized, send("/pb?click_id=c1&payout=99.00"))
	require.Equal(t, http.StatusUnauthorized, send("/pb"))
	require.Equal(t, http.StatusUnauthorized, send("/pb?payout=12.50&click_id=c1"), "the target exactly as sent")
}
