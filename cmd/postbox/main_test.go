package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/postbox-relay/postbox/relay/pgtest"
)

// The test binary doubles as postbox: with this variable set it runs main,
// so tests can kill a real postbox process.
const envAsMain = "POSTBOX_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(envAsMain) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	code := pgtest.Main(m)
	if code == 0 {
		// Commands that run in this process (demo, the operator commands)
		// leave nothing running behind them.
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines outlived the tests:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// proc is a postbox process started by a test.
type proc struct {
	cmd    *exec.Cmd
	out    *lockedBuffer
	exited chan struct{}
	err    error
}

func startPostbox(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), envAsMain+"=1"), env...)
	return startCmd(t, cmd, args)
}

// startCmd starts cmd, collects its output, and kills it when the test
// ends, printing the output if the test failed.
func startCmd(t *testing.T, cmd *exec.Cmd, args []string) *proc {
	t.Helper()
	p := &proc{cmd: cmd, out: &lockedBuffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	require.NoError(t, cmd.Start())
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("postbox %s output:\n%s", strings.Join(args, " "), p.out.String())
		}
	})
	return p
}

func (p *proc) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	<-p.exited
}

func (p *proc) signal(t *testing.T, sig os.Signal) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(sig))
}

// waitLog waits until the process has logged a line containing substr:
// log lines may follow the effect they describe by a moment.
func (p *proc) waitLog(t *testing.T, within time.Duration, substr string) {
	t.Helper()
	waitForT(t, within, "the log line "+strconv.Quote(substr), func() bool { return strings.Contains(p.out.String(), substr) })
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(within):
		t.Fatalf("postbox did not exit within %s", within)
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	require.NoError(t, p.err)
	return 0
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// counter is a receiver counting requests per webhook-id.
type counter struct {
	*httptest.Server
	mu     sync.Mutex
	ids    map[string]int
	total  int
	onRecv func(n int) // called with the running total, before answering
	delay  time.Duration
}

func newCounter(t *testing.T) *counter {
	c := &counter{ids: map[string]int{}}
	c.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		c.mu.Lock()
		c.ids[r.Header.Get("webhook-id")]++
		c.total++
		n, hook, delay := c.total, c.onRecv, c.delay
		c.mu.Unlock()
		if hook != nil {
			hook(n)
		}
		time.Sleep(delay)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(c.Close)
	return c
}

func (c *counter) snapshot() (distinct, total int, dups map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	dups = map[string]int{}
	for id, n := range c.ids {
		if n > 1 {
			dups[id] = n
		}
	}
	return len(c.ids), c.total, dups
}

func writeConfig(t *testing.T, dbURL, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "postbox.yaml")
	base := fmt.Sprintf(`database_url: %s
slot: %s
publication: %s
allow_private_targets: true
admin_listen: 127.0.0.1:0
lease: 2s
sweep_interval: 200ms
status_interval: 1s
shutdown_grace: 5s
log_level: debug
defaults:
  backoff_base: 50ms
`, dbURL, pgtest.UniqueName("slot"), pgtest.UniqueName("pub"))
	// A top-level key the test sets replaces the base's.
	given := map[string]bool{}
	for _, line := range strings.Split(body, "\n") {
		if k, _, ok := strings.Cut(line, ":"); ok && k != "" && !strings.HasPrefix(k, " ") {
			given[k] = true
		}
	}
	var cfg strings.Builder
	skipping := false
	for _, line := range strings.Split(base, "\n") {
		if k, _, ok := strings.Cut(line, ":"); ok && !strings.HasPrefix(line, " ") {
			skipping = given[k]
		}
		if !skipping && line != "" {
			cfg.WriteString(line + "\n")
		}
	}
	cfg.WriteString(body)
	require.NoError(t, os.WriteFile(path, []byte(cfg.String()), 0o600))
	return path
}

func queryInt(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

func waitForT(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func newPool(t *testing.T, dbURL string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// waitStreaming waits until a walsender streams the test database's slot
// (a slot being created shows as active too, so that is not enough).
// streamingRelay writes a configuration of body for dbURL, starts
// `postbox run` with it and waits until it streams; it returns the process
// and the configuration's path, for further instances.
func streamingRelay(t *testing.T, dbURL string, pool *pgxpool.Pool, body string) (*proc, string) {
	t.Helper()
	cfg := writeConfig(t, dbURL, body)
	p := startPostbox(t, nil, "run", "--config", cfg)
	waitStreaming(t, pool)
	return p, cfg
}

func waitStreaming(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	// A new slot waits for every transaction running anywhere in the
	// cluster to end (PostgreSQL's snapshot builder), and this package's
	// tests share one cluster: one of them freezing a relay inside a
	// transaction, or the load of the others, held a slot's creation for
	// 31 s in CI, and the walsender caught up after it.
	waitForT(t, 3*time.Minute, "postbox to stream", func() bool {
		var n int
		_ = pool.QueryRow(context.Background(), `
			SELECT count(*) FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid
			WHERE s.database = current_database() AND r.state = 'streaming'`).Scan(&n)
		return n == 1
	})
}

var (
	buildOnce sync.Once
	builtPath string
	buildErr  error
)

// builtPostbox builds the postbox binary without the race detector, for
// measurements of the process itself (the test binary, built with -race,
// carries the detector's shadow memory).
func builtPostbox(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "postbox-bin-")
		if err != nil {
			buildErr = err
			return
		}
		builtPath = filepath.Join(dir, "postbox")
		out, err := exec.Command("go", "build", "-o", builtPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtPath
}

// startBuilt starts the binary from builtPostbox.
func startBuilt(t *testing.T, args ...string) *proc {
	t.Helper()
	return startCmd(t, exec.Command(builtPostbox(t), args...), args)
}

// postbox run refuses at once, naming the cause, what cannot work: a taken
// admin address, a role that may not stream.
func TestRunExitsAtOnceOnStartUpErrors(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	p := startPostbox(t, []string{"POSTBOX_DATABASE_URL=" + dbURL, "POSTBOX_ADMIN_LISTEN=" + ln.Addr().String(), "POSTBOX_CONFIG="}, "run")
	require.Equal(t, exitFailure, p.wait(t, 5*time.Second))
	require.Contains(t, p.out.String(), "admin listener on "+ln.Addr().String())
	require.Contains(t, p.out.String(), "address already in use")

	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer pool.Close()
	role := fmt.Sprintf("norepl_%d", time.Now().UnixNano())
	_, err = pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP ROLE `+role) })
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = url.User(role)
	p = startPostbox(t, []string{"POSTBOX_DATABASE_URL=" + u.String(), "POSTBOX_ADMIN_LISTEN=127.0.0.1:0", "POSTBOX_CONFIG="}, "run")
	require.Equal(t, exitFailure, p.wait(t, 5*time.Second))
	require.Contains(t, p.out.String(), `ALTER ROLE "`+role+`" WITH REPLICATION`)
}
