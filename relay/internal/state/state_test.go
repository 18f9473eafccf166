package state_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/internal/state"
)

func TestReleasedNotQueued(t *testing.T) {
	t.Parallel()

	require.False(t, state.Released.Queued())
}

func TestStrings(t *testing.T) {
	t.Parallel()

	require.Equal(t, "failure", state.SignalFailure.String())
	require.Equal(t, "signal(7)", state.Signal(7).String())
}
