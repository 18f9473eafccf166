package execute

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/state"
)

// An event written with outbox.Emit resolves to a messages_off dead letter
// under a configuration with outbox_messages off, before anything else is
// judged (a broken message too, since it may be a forgery), and to its
// request once they are on; an outbox row is the same either way.
func TestMessagesResolveOnlyWhenOn(t *testing.T) {
	ep := config.Endpoint{Name: "own", Configured: true, URL: "http://127.0.0.1:8080/hook", Method: "POST"}
	off := &config.Config{MaxBody: 1 << 20, Endpoints: map[string]config.Endpoint{"own": ep}, AllowPrivateTargets: true}
	on := *off
	on.Messages = true
	msg := Event{Event: state.Event{EventID: "e", Endpoint: "own", Payload: []byte(`{}`), Message: true}}

	got := Resolve(off, msg)
	require.True(t, strings.HasPrefix(got.Reason, "messages_off: "), got.Reason)
	require.Empty(t, got.URL)
	broken := msg
	broken.Invalid = "invalid_row: message has no endpoint"
	require.True(t, strings.HasPrefix(Resolve(off, broken).Reason, "messages_off: "))

	got = Resolve(&on, msg)
	require.Empty(t, got.Reason)
	require.Equal(t, ep.URL, got.URL)
	require.Equal(t, broken.Invalid, Resolve(&on, broken).Reason)

	row := msg
	row.Message = false
	require.Empty(t, Resolve(off, row).Reason)
}
