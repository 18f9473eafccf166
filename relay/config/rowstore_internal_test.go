package config

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRowStoreAgainstAMap: puts, updates and removes, with names whose
// hashes collide (a mask of three bits) and compactions on the way, keep
// exactly what a map would.
func TestRowStoreAgainstAMap(t *testing.T) {
	t.Parallel()
	for _, mask := range []uint64{^uint64(0), 7} {
		s := newRowStore(0)
		s.mask = mask
		want := map[string]string{}
		rng := rand.New(rand.NewPCG(1, mask))
		for op := range 50_000 {
			name := fmt.Sprintf("ep-%d", rng.IntN(500))
			if rng.IntN(4) == 0 {
				s.remove(name)
				delete(want, name)
				continue
			}
			row := fmt.Sprintf(`{"url": "https://partner.example/%d", "pad": "%s"}`, op, strings.Repeat("x", rng.IntN(2000)))
			s.put(name, []byte(row), int64(op), false)
			want[name] = row
		}
		require.Equal(t, len(want), s.used)
		got := map[string]string{}
		s.each(func(i int32) { got[s.name(i)] = string(s.row(i)) })
		require.Equal(t, want, got)
		for name, row := range want {
			i, _, ok := s.find(name)
			require.True(t, ok, name)
			require.Equal(t, row, string(s.row(i)))
		}
		_, _, ok := s.find("ep-none")
		require.False(t, ok)
		require.Less(t, s.dead, max(compactMin, s.size/2)+4000, "dead bytes are compacted away")
	}
}

// TestRowStoreRowOutlivesCompaction: a row read under the table's lock
// stays as it was after later puts and a compaction.
func TestRowStoreRowOutlivesCompaction(t *testing.T) {
	t.Parallel()
	s := newRowStore(0)
	s.put("a", []byte("first"), 1, false)
	i, _, _ := s.find("a")
	row := s.row(i)
	for n := range 2000 {
		s.put("a", make([]byte, 1000), int64(n+2), false)
	}
	require.Equal(t, "first", string(row))
	require.Panics(t, func() { _ = row[:6] }, "a row's capacity ends with it: an append cannot write into the arena")
}
