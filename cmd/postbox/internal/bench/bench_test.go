package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func TestOptions(t *testing.T) {
	t.Parallel()
	o := Options{}.WithDefaults()
	names, err := o.validate()
	require.NoError(t, err)
	require.Equal(t, []string{"latency", "catchup"}, names)
	require.Equal(t, RateDefault, o.Rate)

	_, err = Options{Scenarios: "latency,nope"}.WithDefaults().validate()
	require.ErrorContains(t, err, `"nope"`)
	_, err = Options{Rate: -1}.WithDefaults().validate()
	require.Error(t, err)
}

// TestRun runs a small latency scenario and catch-up end to end, with the
// relay as its own process: nothing lost. (The load
// scenario adds a baseline run and a drain; it is left to `postbox bench`.)
func TestRun(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts the relay process three times")
	}
	opts := Options{
		Scenarios:   "latency,catchup",
		Rate:        50,
		Endpoints:   3,
		Duration:    2 * time.Second,
		Backlog:     300,
		RelayBinary: buildPostbox(t),
		DatabaseURL: pgtest.NewDatabase(t),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := Run(ctx, opts, t.Output())
	require.NoError(t, err)

	l := res.Latency
	require.NotNil(t, l)
	require.Positive(t, l.Sent)
	require.Equal(t, l.Sent, l.Received)
	require.Zero(t, l.Lost)
	require.Zero(t, l.Dups)
	require.Positive(t, l.P50ms)

	c := res.Catchup
	require.NotNil(t, c)
	require.Equal(t, 300, c.Backlog)
	require.Zero(t, c.Lost)
	require.Zero(t, c.Dups)

	var out strings.Builder
	res.Print(&out)
	require.Contains(t, out.String(), "lost 0, duplicates 0")
}

// buildPostbox builds the postbox binary, which the bench runs as the
// relay (in `postbox bench` it is the running executable itself).
func buildPostbox(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "postbox")
	out, err := exec.Command("go", "build", "-o", path, "github.com/postbox-relay/postbox/cmd/postbox").CombinedOutput()
	require.NoError(t, err, fmt.Sprintf("go build: %s", out))
	return path
}
