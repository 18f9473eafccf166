package maintain

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/config"
)

// The secrets watcher reloads the configuration when a secrets file
// changes, and keeps the secrets in use when the new file does not load.
func TestSecretsWatcherReloadsARotatedSecret(t *testing.T) {
	t.Parallel()
	secrets := filepath.Join(t.TempDir(), "secrets")
	require.NoError(t, os.WriteFile(secrets, []byte(outbox.NewSecret()+"\n"), 0o600))
	f := config.Default()
	f.Signing.SecretsFile = secrets
	resolved, err := f.Resolve()
	require.NoError(t, err)
	tb := setup(t, func(c *config.Config) { *c = *resolved })

	reloaded := make(chan *config.Config, 1)
	w := newSecretsWatcher(tb.env, func(c *config.Config) error { reloaded <- c; return nil })
	require.Equal(t, SecretsPollDefault, w.poll)
	w.poll = tick
	require.NoError(t, w.Start(context.Background()))
	defer w.Stop()

	rotated := outbox.NewSecret()
	require.NoError(t, os.WriteFile(secrets, []byte(rotated+"\n"+outbox.NewSecret()+"\n"), 0o600))
	select {
	case c := <-reloaded:
		require.Len(t, c.Secrets, 2)
	case <-time.After(wait):
		t.Fatal("no reload")
	}

	require.NoError(t, os.WriteFile(secrets, nil, 0o600))
	require.Eventually(t, func() bool { return strings.Contains(tb.log.String(), "does not load") }, wait, tick)
	require.Empty(t, reloaded, "the secrets in use stay")
}
