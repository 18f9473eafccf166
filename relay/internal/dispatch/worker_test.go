package dispatch_test

import (
	"bytes"
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/postbox-relay/postbox/relay/internal/dispatch"
	"github.com/postbox-relay/postbox/relay/internal/state"
	"github.com/postbox-relay/postbox/relay/postboxtype"
)

// goroutineID is the running goroutine's number, from its stack's header.
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	id, _, _ := bytes.Cut(bytes.TrimPrefix(buf, []byte("goroutine ")), []byte(" "))
	return string(id)
}

// Attempts one after another run on the few goroutines the first ones
// started (a submit that comes before the last attempt's goroutine waits
// again starts another), and Stop returns only once all of them, idle by
// then, have returned.
func TestAttemptGoroutinesAreReusedAndJoined(t *testing.T) {
	before := goleak.IgnoreCurrent()
	var mu sync.Mutex
	ids := map[string]int{}
	done := make(chan struct{}, 1)
	var d *dispatch.Dispatcher
	d = connected(dispatch.Options{
		Capacity: func(string) int { return 1 },
		Execute: func(_ context.Context, j *dispatch.Job) state.Result {
			mu.Lock()
			ids[goroutineID()]++
			mu.Unlock()
			return state.Result{DeliveryID: j.DeliveryID, Status: postboxtype.DeliveryDelivered}
		},
	}, func(o dispatch.Outcome) {
		d.Recorded(o.Job)
		done <- struct{}{}
	})
	for i := range 20 {
		d.Submit(&dispatch.Job{DeliveryID: int64(i), Event: state.Event{Endpoint: "e"}}, false)
		<-done
	}
	mu.Lock()
	require.LessOrEqual(t, len(ids), 5, "20 attempts, one at a time, reuse their goroutines: %v", ids)
	mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d.Stop(ctx)
	goleak.VerifyNone(t, before)
}
