package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

// TestExampleReceivers runs the relay against each example receiver in
// another language, with a JSON POST endpoint and a GET postback template,
// and checks that every delivery verified there (and that a forged one
// did not: the receiver really checks).
func TestExampleReceivers(t *testing.T) {
	t.Parallel()
	for _, rc := range []struct {
		name, dir, interp, script, needs string
	}{
		{"node", "node-receiver", "node", "server.js", "node_modules/standardwebhooks"},
		{"python", "python-receiver", "python3", "server.py", ""},
	} {
		t.Run(rc.name, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join("..", "..", "examples", rc.dir)
			interp, err := exec.LookPath(rc.interp)
			if err == nil && rc.needs != "" {
				_, err = os.Stat(filepath.Join(dir, rc.needs))
			}
			if err != nil {
				if os.Getenv("CI") != "" {
					t.Fatalf("%s receiver: %v (.ci/run installs it)", rc.name, err)
				}
				t.Skipf("%s receiver: %v (cd examples/%s and install its dependencies)", rc.name, err, rc.dir)
			}
			exampleReceiver(t, dir, interp, rc.script)
		})
	}
}

var listening = regexp.MustCompile(`listening on (\d+)`)

func exampleReceiver(t *testing.T, dir, interp, script string) {
	secret := outbox.NewSecret()
	cmd := exec.Command(interp, script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "WEBHOOK_SECRET="+secret, "PORT=0")
	recv := startCmd(t, cmd, []string{script})
	var port string
	waitForT(t, 30*time.Second, "the receiver to listen", func() bool {
		m := listening.FindStringSubmatch(recv.out.String())
		if m != nil {
			port = m[1]
		}
		return m != nil
	})
	base := "http://127.0.0.1:" + port

	// A forged delivery is refused.
	req, err := http.NewRequest(http.MethodPost, base+"/hook", strings.NewReader(`{"payout":"99.00"}`))
	require.NoError(t, err)
	req.Header.Set("webhook-id", "msg_forged")
	req.Header.Set("webhook-timestamp", fmt.Sprint(time.Now().Unix()))
	req.Header.Set("webhook-signature", "v1,bm90IGEgc2lnbmF0dXJl")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "a forged signature is refused")

	dbURL := pgtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	cfg := writeConfig(t, dbURL, fmt.Sprintf(`signing:
  secrets: [%s]
endpoints:
  json:
    url: %s/hook
  postback:
    url: "%s/pb?click_id={payload.click_id}&payout={payload.payout}&sub={payload.sub|}"
`, secret, base, base))
	startBuilt(t, "run", "--config", cfg)
	waitStreaming(t, pool)
	const n = 10
	ctx := context.Background()
	for i := range n {
		_, err := pool.Exec(ctx, `INSERT INTO postbox.outbox (endpoint, payload) VALUES
			('json', jsonb_build_object('i', $1::int, 'note', 'ünïcode & "quotes"')),
			('postback', jsonb_build_object('click_id', 'c ' || $1 || '&x=/?', 'payout', '12.50'))`, i)
		require.NoError(t, err)
	}
	waitForT(t, time.Minute, "every delivery delivered", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM postbox.deliveries WHERE status = 'delivered'`) == 2*n
	})
	out := recv.out.String()
	require.Equal(t, 2*n, strings.Count(out, "verified "), out)
	require.Equal(t, 1, strings.Count(out, "rejected "), "only the forged one: %s", out)
}
