package relay_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/dispatch"
	"github.com/postbox-relay/postbox/relay/internal/wal"
)

// The configuration owns the defaults the relay passes to the stream and
// the dispatcher, which do not import it; their fallbacks, for callers
// that pass nothing, must say the same.
func TestDefaultsAgreeWithTheMachinery(t *testing.T) {
	t.Parallel()
	require.Equal(t, config.StatusIntervalDefault, wal.StatusIntervalDefault)
	require.Equal(t, config.MaxConcurrencyDefault, dispatch.MaxConcurrencyDefault)
}
