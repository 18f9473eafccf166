package telemetry_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/telemetry"
)

// TestSentForOperator: the target as sent reaches the operator only with
// log_payloads, its query kept and the endpoint's redact_path applied;
// response bodies follow log_payloads alike, secrets removed always.
func TestSentForOperator(t *testing.T) {
	t.Parallel()
	sent := "https://hooks.example/services/T1/SECRET/x?click_id=c_8812&payout=12.50"
	require.Empty(t, telemetry.SentForOperator(sent, 0, false))
	require.Equal(t, sent, telemetry.SentForOperator(sent, 0, true))
	require.Equal(t, "https://hooks.example/services/T1/***/x?click_id=c_8812&payout=12.50",
		telemetry.SentForOperator(sent, config.RedactPath(1<<3), true))

	shown, hidden := telemetry.ResponseForOperator("ok click_id=c_8812", false)
	require.Empty(t, shown)
	require.True(t, hidden)
	shown, hidden = telemetry.ResponseForOperator("ok whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", true)
	require.False(t, hidden)
	require.NotContains(t, shown, "MfKQ9r8GKYqr")
	shown, hidden = telemetry.ResponseForOperator("", false)
	require.Empty(t, shown)
	require.False(t, hidden)
}
