package policy

import (
	"time"

	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// OK reports whether ordinary attempts may start.
func (b Breaker) OK() bool { return b.State == "" || b.State == postboxtype.BreakerClosed }

// ReopensAt is when an open breaker admits its probe.
func (b Breaker) ReopensAt() time.Time { return b.OpenedAt.Add(b.Cooldown) }
