package config_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/config"
)

// TestOutboxMessagesAreOptIn: events written with outbox.Emit are
// delivered only when the configuration says so, in the file or the
// environment; outbox_message_roles lists each role once.
func TestOutboxMessagesAreOptIn(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse(nil)
	require.NoError(t, err)
	require.False(t, cfg.Messages, "off by default")

	cfg, err = config.Parse([]byte("outbox_messages: true\noutbox_message_roles: [app, Billing]\n"))
	require.NoError(t, err)
	require.True(t, cfg.Messages)
	require.Equal(t, []string{"app", "Billing"}, cfg.MessageRoles)

	env := map[string]string{config.EnvOutboxMessages: "true"}
	f, err := config.LoadFile("", func(k string) string { return env[k] })
	require.NoError(t, err)
	require.True(t, f.OutboxMessages)
	env[config.EnvOutboxMessages] = "sometimes"
	_, err = config.LoadFile("", func(k string) string { return env[k] })
	var ce *config.Error
	require.ErrorAs(t, err, &ce)
	require.Equal(t, config.EnvOutboxMessages, ce.Key)

	_, err = config.Parse([]byte("outbox_message_roles: [app, app]\n"))
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "outbox_message_roles[1]", ce.Key)
}
