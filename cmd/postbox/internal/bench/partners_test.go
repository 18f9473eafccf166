package bench

import (
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
)

// TestSocketPIDFindsTheSendingProcess: the receiver finds the process
// that holds a request's socket among those it is given, passing over
// one that does not (here the test's parent).
func TestSocketPIDFindsTheSendingProcess(t *testing.T) {
	t.Parallel()
	rv := newReceiver(outbox.NewSecret())
	defer rv.Close()
	got := make(chan int, 1)
	rv.setFollow(func(w http.ResponseWriter, r *http.Request, _ time.Time) {
		got <- socketPID(r, rv.port(), os.Getppid(), os.Getpid())
		w.WriteHeader(http.StatusNoContent)
	})
	resp, err := http.Post(rv.URL+"/follow/x", "application/json", strings.NewReader("{}"))
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	require.Equal(t, os.Getpid(), <-got)
}
