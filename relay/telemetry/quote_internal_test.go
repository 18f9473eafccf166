package telemetry

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An endpoint's name can come from a row. In the dead-letter advice it is
// shell-quoted where it stands in a command to paste, and its control
// characters (a terminal escape) never reach the operator.
func TestDeadLetterAdviceQuotesTheEndpoint(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for _, a := range []Analysis{
		{Endpoint: "x; rm -rf ~\x1b[2J", DeadCount: 20, PrimaryError: "http 429", RateLimited: 20, FirstDead: now, LastDead: now},
		{Endpoint: "x; rm -rf ~\x1b[2J", DeadCount: 2, PrimaryError: "http 500", FirstDead: now, LastDead: now},
	} {
		_, advice := classifyDeadLetters(a)
		require.NotContains(t, advice, "\x1b", advice)
		require.Contains(t, advice, `--endpoint $'x; rm -rf ~\x1b[2J'`, advice)
		require.False(t, strings.Contains(advice, "--endpoint x; rm"), advice)
	}
	require.Equal(t, "plain-name_1", ShellQuote("plain-name_1"))
	require.Equal(t, `'it'\''s'`, ShellQuote("it's"))
	require.Equal(t, "ab", Printable("a\x07b"))
}
