package state_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/internal/state"
)

func TestDeliveryQueued(t *testing.T) {
	t.Parallel()

	for d, queued := range map[state.Delivery]bool{
		state.Pending: true, state.InFlight: true, state.Failed: true,
		state.Delivered: false, state.DeadLetter: false, state.Replayed: false, state.Released: false, "": false,
	} {
		require.Equal(t, queued, d.Queued(), "%q", d)
	}
}

func TestStrings(t *testing.T) {
	t.Parallel()

	require.Equal(t, "dead_letter", state.DeadLetter.String())
	require.Equal(t, "half_open", state.BreakerHalfOpen.String())
	require.Equal(t, "failure", state.SignalFailure.String())
	require.Equal(t, "signal(7)", state.Signal(7).String())
}
