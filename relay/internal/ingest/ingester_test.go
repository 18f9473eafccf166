package ingest

import "testing"

// An ingest of n rows takes as few statements as MaxInsertRowsDefault
// allows, none above it, and their sizes differ by one row at most.
func TestStatementRowsSplitsEvenly(t *testing.T) {
	for n := 1; n <= 3*MaxInsertRowsDefault+7; n++ {
		size := statementRows(n)
		if size < 1 || size > MaxInsertRowsDefault {
			t.Fatalf("%d rows: statements of %d", n, size)
		}
		want := (n + MaxInsertRowsDefault - 1) / MaxInsertRowsDefault
		got, last := 0, 0
		for left := n; left > 0; left -= min(left, size) {
			got, last = got+1, min(left, size)
		}
		if got != want {
			t.Fatalf("%d rows: %d statements of %d, want %d", n, got, size, want)
		}
		if size-last > got-1 {
			t.Fatalf("%d rows: statements of %d and a last of %d", n, size, last)
		}
	}
	if got := statementRows(2500); got != 1250 {
		t.Fatalf("2,500 rows: statements of %d, want 1,250", got)
	}
}
