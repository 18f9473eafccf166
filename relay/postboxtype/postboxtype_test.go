package postboxtype_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/postboxtype"
)

func TestDeliveryQueued(t *testing.T) {
	t.Parallel()

	for d, queued := range map[postboxtype.DeliveryState]bool{
		postboxtype.DeliveryPending: true, postboxtype.DeliveryInFlight: true, postboxtype.DeliveryFailed: true,
		postboxtype.DeliveryDelivered: false, postboxtype.DeliveryDeadLetter: false, postboxtype.DeliveryReplayed: false, "": false,
	} {
		require.Equal(t, queued, d.Queued(), "%q", d)
	}
}

func TestStrings(t *testing.T) {
	t.Parallel()

	require.Equal(t, "dead_letter", postboxtype.DeliveryDeadLetter.String())
	require.Equal(t, "half_open", postboxtype.BreakerHalfOpen.String())
}
