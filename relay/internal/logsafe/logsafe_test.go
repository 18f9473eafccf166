package logsafe_test

import (
	"bytes"
	"errors"
	"net/url"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/internal/logsafe"
)

func TestPolicyRedactsWhateverWroteIt(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := zerolog.New(logsafe.NewWriter(&buf, false))
	urlErr := &url.Error{Op: "Get", URL: "https://t.example/pb?click_id=CLK-7781&payout=12.50", Err: errors.New("connection refused")}
	log.Warn().Err(urlErr).Str("url", "https://u:p@t.example/pb/x?click_id=CLK-7781#frag").
		RawJSON("payload", []byte(`{"click_id":"CLK-7781","payout":"12.50"}`)).
		Str("secret", "whsec_c2VjcmV0c2VjcmV0").Str("note", "rotated whsec_QUJDREVGR0g= today").
		Str("event_id", "e-1").Msg("attempt to https://t.example/pb?payout=12.50 failed")
	line := buf.String()
	for _, leak := range []string{"CLK-7781", "12.50", "whsec_", "u:p@", "frag"} {
		require.NotContains(t, line, leak)
	}
	require.Contains(t, line, `"url":"https://t.example/pb/x"`)
	require.Contains(t, line, `https://t.example/pb failed`)
	require.Contains(t, line, `"event_id":"e-1"`)
	require.Contains(t, line, `connection refused`)
}

func TestPayloadsShownOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := zerolog.New(logsafe.NewWriter(&buf, true))
	log.Debug().Str("url", "https://partner:hunter2@t.example/pb?click_id=CLK-1").RawJSON("payload", []byte(`{"payout":"9.99"}`)).
		Str("token", "tok-123").Msg("attempt")
	line := buf.String()
	require.Contains(t, line, "click_id=CLK-1")
	require.Contains(t, line, "9.99")
	require.NotContains(t, line, "tok-123", "secrets never show")
	require.NotContains(t, line, "hunter2", "nor a URL's password")
	require.Contains(t, line, "https://[redacted]@t.example/pb?click_id=CLK-1")
}

// Plain text (a fatal error on standard error) passes the same policy:
// no URL's user:pass@, with payloads shown or not.
func TestFreeTextLosesUserInfo(t *testing.T) {
	t.Parallel()
	for _, show := range []bool{false, true} {
		var buf bytes.Buffer
		_, err := logsafe.NewWriter(&buf, show).Write([]byte("postbox: connect postgres://relay:s3cr3t-pw@db.internal:5432/app: refused; also http://a:b@[::1\n"))
		require.NoError(t, err)
		require.NotContains(t, buf.String(), "s3cr3t-pw")
		require.NotContains(t, buf.String(), "a:b@")
		require.Contains(t, buf.String(), "db.internal:5432/app")
	}
}

func TestLinesWithoutTriggersPassUntouched(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	w := logsafe.NewWriter(&buf, false)
	in := []byte(`{"level":"info","endpoint":"p","status_code":200,"message":"attempt"}` + "\n")
	_, err := w.Write(in)
	require.NoError(t, err)
	require.Equal(t, string(in), buf.String())
}

// A Writer over a Writer filters once, under the stricter policy: the
// process's standard error (payloads shown) under a relay that hides them.
func TestNestedWritersKeepTheStricterPolicy(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := zerolog.New(logsafe.NewWriter(logsafe.NewWriter(&buf, true), false))
	log.Info().RawJSON("payload", []byte(`{"click_id":"CLK-9"}`)).Msg("x")
	require.NotContains(t, buf.String(), "CLK-9")
}
