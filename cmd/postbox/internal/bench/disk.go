package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// DiskFlush is the disk's own share of every commit: PostgreSQL flushes a
// transaction's WAL (for a single-row one, part of an 8 kB page) before
// its commit returns and before the walsender may send it, and the commit
// timestamp is taken before that flush.
type DiskFlush struct {
	Samples int     `json:"samples"`
	PerS    int     `json:"per_s"`
	P50ms   float64 `json:"p50_ms"`
	P99ms   float64 `json:"p99_ms"`
	Maxms   float64 `json:"max_ms"`
}

// diskFlushFile is the probe's file, in the cluster's directory and gone
// when it is done.
const diskFlushFile = "postbox_bench_flush"

// diskFlush times n flushes of one 8 kB page in dir, perS a second (the
// scenario's pace: a disk idle between flushes may be slower than one
// flushing back to back), each a write at the next offset of a file
// written once before, as PostgreSQL's WAL segments are, and datasync.
func diskFlush(ctx context.Context, dir string, n, perS int) (*DiskFlush, error) {
	const page, pages = 8 << 10, 1024
	path := filepath.Join(dir, diskFlushFile)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.Remove(path) }()
	defer func() { _ = f.Close() }()
	if _, err := f.Write(make([]byte, page*pages)); err != nil {
		return nil, err
	}
	if err := datasync(f); err != nil {
		return nil, err
	}
	buf := make([]byte, page)
	for i := range buf {
		buf[i] = byte(i)
	}
	took := make([]float64, 0, n)
	interval := time.Second / time.Duration(perS)
	start := time.Now()
	for i := 0; i < n && ctx.Err() == nil; i++ {
		sleep(ctx, time.Until(start.Add(time.Duration(i)*interval)))
		t := time.Now()
		if _, err := f.WriteAt(buf, int64(i%pages)*page); err != nil {
			return nil, err
		}
		if err := datasync(f); err != nil {
			return nil, err
		}
		took = append(took, float64(time.Since(t))/float64(time.Millisecond))
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	slices.Sort(took)
	return &DiskFlush{Samples: len(took), PerS: perS, P50ms: quantile(took, 0.5), P99ms: quantile(took, 0.99), Maxms: quantile(took, 1)}, nil
}

func (d *DiskFlush) print(w io.Writer) {
	if d == nil {
		return
	}
	fmt.Fprintf(w, "  the disk alone, after the run (a commit's WAL flush is under every row's latency): 8 kB written and datasynced %d times a second in the cluster's directory, p50 %.2f ms, p99 %.2f ms, max %.2f ms (%d flushes)\n",
		d.PerS, d.P50ms, d.P99ms, d.Maxms, d.Samples)
}
