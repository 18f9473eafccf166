package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/cmd/postbox/internal/bench"
	"github.com/postbox-relay/postbox/relay/pgtest"
)

// subcommands are the words that name a command of their own after a
// command's name.
var subcommands = map[string][]string{
	"endpoints":    {"pause", "resume", "add", "set", "disable", "enable", "rm", "export", "import", "history"},
	"dead-letters": {"analyze"},
	"secret":       {"new", "show"},
	"portal":       {"link", "revoke"},
}

// commandFlags returns the flags a command (its words, such as "endpoints
// pause") accepts, read from its -h output: what its flag set holds.
func commandFlags(t *testing.T, words ...string) map[string]bool {
	t.Helper()
	var stderr bytes.Buffer
	run(append(append([]string(nil), words...), "-h"), io.Discard, &stderr)
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z][a-z0-9-]*)`).FindAllStringSubmatch(stderr.String(), -1) {
		flags[m[1]] = true
	}
	return flags
}

// allCommands lists every command by its words.
func allCommands() [][]string {
	var out [][]string
	for _, c := range commands {
		out = append(out, []string{c.name})
		for _, sub := range subcommands[c.name] {
			out = append(out, []string{c.name, sub})
		}
	}
	return out
}

// TestUsageMatchesFlagSets: what the usage text says of --config and
// --json is what each command's flag set accepts, and every flag the
// usage names under a command is one of its flags.
func TestUsageMatchesFlagSets(t *testing.T) {
	t.Parallel()
	var noConfig, withJSON []string
	for _, words := range allCommands() {
		if (words[0] == "secret" || words[0] == "portal") && len(words) == 1 || words[0] == "help" {
			continue // "secret" or "portal" alone is a usage error, not a command
		}
		flags := commandFlags(t, words...)
		name := strings.Join(words, " ")
		if !flags["config"] {
			noConfig = append(noConfig, name)
		}
		if flags["json"] {
			withJSON = append(withJSON, name)
		}
	}
	listed := func(s string) []string {
		s = strings.NewReplacer("\n", " ", " and ", ", ", "(each subcommand too)", ", endpoints "+strings.Join(subcommands["endpoints"], ", endpoints "), "(analyze too)", ", dead-letters analyze").Replace(s)
		var out []string
		for _, f := range strings.Split(s, ",") {
			if f = strings.Join(strings.Fields(f), " "); f != "" {
				out = append(out, f)
			}
		}
		sort.Strings(out)
		return out
	}
	sort.Strings(noConfig)
	sort.Strings(withJSON)
	require.Equal(t, noConfig, listed(noConfigCommands), "the usage names the commands without --config")
	require.Equal(t, withJSON, listed(jsonCommands), "the usage names the commands with --json")

	// Each command's lines of the usage: a line indented by two spaces
	// starts a command, deeper ones continue it.
	var cmd []string
	for _, line := range strings.Split(usage[strings.Index(usage, "Commands:"):strings.Index(usage, "--config FILE")], "\n") {
		if strings.HasPrefix(line, "  ") && !strings.HasPrefix(line, "   ") {
			cmd = commandWords(strings.Fields(line))
		}
		if cmd == nil {
			continue
		}
		flags := commandFlags(t, cmd...)
		for _, f := range flagsIn(line) {
			if f == "h" {
				continue
			}
			require.True(t, flags[f], "the usage names --%s under %q, which does not take it", f, strings.Join(cmd, " "))
		}
	}
}

// commandWords returns the command a command line names (its first words
// that are a command and a subcommand of it), or nil.
func commandWords(fields []string) []string {
	if len(fields) == 0 || !slices.ContainsFunc(commands, func(c command) bool { return c.name == fields[0] }) {
		return nil
	}
	if len(fields) > 1 && slices.Contains(subcommands[fields[0]], fields[1]) {
		return fields[:2]
	}
	return fields[:1]
}

var flagRe = regexp.MustCompile(`(?:^|[\s\[(/,])--?([a-z][a-z0-9-]*)`)

// flagsIn returns the --flags a piece of text names.
func flagsIn(s string) []string {
	var out []string
	for _, m := range flagRe.FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}

// docFiles are the markdown files a user reads: the README and docs/.
func docFiles(t *testing.T) map[string]string {
	t.Helper()
	paths, err := filepath.Glob("../../docs/*.md")
	require.NoError(t, err)
	paths = append(paths, "../../README.md")
	out := map[string]string{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		out[strings.TrimPrefix(p, "../../")] = string(b)
	}
	require.Contains(t, out, "docs/operations.md")
	return out
}

// codeLines returns the lines of a markdown file's fenced blocks of the
// given languages ("" for a bare fence), and its inline code spans.
func codeLines(doc string, langs ...string) (fenced, inline []string) {
	in, keep := false, false
	for _, line := range strings.Split(doc, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "```") {
			in = !in
			keep = in && slices.Contains(langs, strings.TrimPrefix(trimmed, "```"))
			continue
		}
		if in {
			if keep {
				fenced = append(fenced, line)
			}
			continue
		}
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(line, -1) {
			inline = append(inline, m[1])
		}
	}
	return fenced, inline
}

var commandLineRe = regexp.MustCompile(`(?:^|[\s=;(])(?:postbox|go run \./cmd/postbox) ([a-z][a-z-]*(?: [a-z][a-z-]*)?)`)

// TestDocsCommandFlagsExist: every `postbox <command> --flag` the README
// and docs/ show, in a shell block or inline, names a command that
// exists and flags its flag set holds.
func TestDocsCommandFlagsExist(t *testing.T) {
	t.Parallel()
	flagsOf := map[string]map[string]bool{}
	named := map[string]bool{} // "command --flag" the docs show
	checked := 0
	for name, doc := range docFiles(t) {
		fenced, inline := codeLines(doc, "sh", "")
		for n, line := range append(fenced, inline...) {
			locs := commandLineRe.FindAllStringSubmatchIndex(line, -1)
			for i, loc := range locs {
				cmd := commandWords(strings.Fields(line[loc[2]:loc[3]]))
				if cmd == nil {
					// A shell block's line that starts with postbox is a command
					// line; inline, "postbox" may be a log line's subject
					// (`postbox started`).
					start := strings.TrimSpace(line)
					require.False(t, n < len(fenced) && (strings.HasPrefix(start, "postbox ") || strings.HasPrefix(start, "go run ./cmd/postbox ")),
						"%s: `%s` names no command of postbox", name, start)
					continue
				}
				end := len(line)
				if i+1 < len(locs) {
					end = locs[i+1][0]
				}
				key := strings.Join(cmd, " ")
				if flagsOf[key] == nil {
					flagsOf[key] = commandFlags(t, cmd...)
				}
				for _, f := range flagsIn(line[loc[3]:end]) {
					if key == "bench" && "--"+f == bench.BareClientArg || f == "h" {
						continue // the bench's own child process, named where it is described; help
					}
					require.True(t, flagsOf[key][f], "%s: `%s`: postbox %s has no --%s", name, strings.TrimSpace(line), key, f)
					named[key+" --"+f] = true
					checked++
				}
			}
		}
	}
	require.Greater(t, checked, 30, "the docs' command lines were found")

	// And the other way: every flag of every command is shown with it
	// somewhere (--config and --json are the usage's, for all of them).
	var missing []string
	for _, words := range allCommands() {
		key := strings.Join(words, " ")
		for f := range commandFlags(t, words...) {
			// dead-letters analyze shares the list's flag set; --limit cuts
			// the list alone.
			if f != "config" && f != "json" && !named[key+" --"+f] && key+" --"+f != "dead-letters analyze --limit" {
				missing = append(missing, "postbox "+key+" --"+f)
			}
		}
	}
	sort.Strings(missing)
	require.Empty(t, missing, "flags no doc shows with their command (in a shell block or inline code)")
}

// sqlBlocks returns a markdown file's ```sql blocks.
func sqlBlocks(doc string) []string {
	var out []string
	for _, m := range regexp.MustCompile("(?s)```sql\n(.*?)```").FindAllStringSubmatch(doc, -1) {
		out = append(out, m[1])
	}
	return out
}

// TestDocsSQLSnippetsRun: every SQL block of the README and docs/, and
// every SQL statement they give inline, runs against a database postbox
// migrated, beside the application's own table the examples write. The
// blocks of "Roles and grants" (A1, A2, B1, B2) are left to
// TestRolesAndGrants, which runs them as the roles they name.
func TestDocsSQLSnippetsRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// The docs' role names, made this test's own (roles are the
	// cluster's). Dropped after the database, which holds their grants.
	names := map[string]string{"app": pgtest.UniqueName("app"), "relay": pgtest.UniqueName("relay")}
	c, err := pgtest.Shared()
	require.NoError(t, err)
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		for _, role := range names {
			_, _ = conn.Exec(ctx, `DROP ROLE IF EXISTS `+role)
		}
	})
	dbURL := pgtest.NewDatabase(t)
	code, out, errOut := postbox(t, "migrate", "--config", writeConfig(t, dbURL, ""))
	require.Equal(t, exitOK, code, out+errOut)
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	for _, role := range names {
		_, err = conn.Exec(ctx, `CREATE ROLE `+role)
		require.NoError(t, err)
	}
	_, err = conn.Exec(ctx, `CREATE TABLE conversions (click_id text, payout numeric)`)
	require.NoError(t, err)
	var version int
	require.NoError(t, conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version))

	exec := func(where, sql string) {
		t.Helper()
		for doc, ours := range names {
			sql = regexp.MustCompile(`\b(ROLE|TO|FROM) `+doc+`\b`).ReplaceAllString(sql, "$1 "+ours)
		}
		if version >= 170000 {
			// The docs' grants are for the signatures before 17, and say
			// so; 17 gave each a fourth argument (flush).
			sql = strings.NewReplacer("(boolean, text, text)", "(boolean, text, text, boolean)",
				"(boolean, text, bytea)", "(boolean, text, bytea, boolean)").Replace(sql)
		}
		_, err := conn.PgConn().Exec(ctx, sql).ReadAll()
		require.NoError(t, err, "%s:\n%s", where, sql)
	}
	ran := 0
	inlineSQL := regexp.MustCompile(`^(SELECT|INSERT INTO|ALTER ROLE) [^…$]*$`)
	for name, doc := range docFiles(t) {
		for _, block := range sqlBlocks(doc) {
			if regexp.MustCompile(`^-- [AB][12],`).MatchString(block) {
				continue // TestRolesAndGrants runs it
			}
			exec(name, block)
			ran++
		}
		_, inline := codeLines(doc)
		for _, span := range inline {
			if inlineSQL.MatchString(span) {
				exec(name, span)
				ran++
			}
		}
	}
	require.GreaterOrEqual(t, ran, 5, "the docs' SQL was found")
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM postbox.outbox`).Scan(&n))
	require.Positive(t, n, "the docs' inserts wrote the outbox")
}

// slug is GitHub's anchor for a heading: lower case, spaces as hyphens,
// punctuation left out.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestDocsLinksResolve: every relative link of the README and docs/
// names a file of the repository, and an anchor a heading of it.
func TestDocsLinksResolve(t *testing.T) {
	t.Parallel()
	docs := docFiles(t)
	anchors := func(doc string) map[string]bool {
		out := map[string]bool{}
		for _, m := range regexp.MustCompile("(?m)^#{1,6} (.+)$").FindAllStringSubmatch(doc, -1) {
			out[slug(strings.ReplaceAll(m[1], "`", ""))] = true
		}
		return out
	}
	checked := 0
	for name, doc := range docs {
		for _, m := range regexp.MustCompile(`\]\(([^)\s]+)\)`).FindAllStringSubmatch(doc, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := name
			if file != "" {
				path = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(name), file)))
				_, err := os.Stat(filepath.Join("../..", path))
				require.NoError(t, err, "%s links to %s, which does not exist", name, target)
			}
			if anchor != "" {
				target, ok := docs[path]
				require.True(t, ok, "%s links to an anchor of %s, which is not one of the docs", name, path)
				require.True(t, anchors(target)[anchor], "%s links to %s#%s, which has no such heading", name, path, anchor)
			}
			checked++
		}
	}
	require.Greater(t, checked, 20, "the docs' links were found")
}
