package pgtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"
)

// StartStandby makes a base backup of c and starts it as c's streaming
// standby (a physical replica, as a high-availability setup has), on its
// own port and directory, streaming through a physical slot of c named
// name. Its walreceiver connects with application_name name, so c can
// make it synchronous.
//
// The backup leaves c's replication slots out, as pg_basebackup does: on
// PostgreSQL before 17 a promoted standby has none. From 17 the standby
// synchronises c's failover slots (sync_replication_slots), and c holds
// its logical walsenders back until the standby has the WAL they send
// (synchronized_standby_slots), so a promoted standby has them.
//
// The backup is a file copy between the server's low-level backup calls:
// pg_basebackup is not in every build the tests use (npm's has none), and
// Debian's 15 cannot copy a 16 to 18.
func (c *Cluster) StartStandby(ctx context.Context, name string) (*Cluster, error) {
	if c.external {
		return nil, errors.New("pgtest: cannot make a standby of an external server")
	}
	slot := sanitize(name)
	s, err := newCluster(c.bindir, c.major)
	if err != nil {
		return nil, err
	}
	if err := c.baseBackup(ctx, s, slot); err != nil {
		_ = os.RemoveAll(s.dir)
		return nil, err
	}
	s.settings = map[string]string{
		"cluster_name": name,
		"hot_standby":  "on",
		// dbname: the slot synchronisation worker connects to a database.
		"primary_conninfo":  fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres application_name=%s", c.port, slot),
		"primary_slot_name": slot,
	}
	if c.major >= 17 {
		s.settings["sync_replication_slots"] = "on"
		s.settings["hot_standby_feedback"] = "on"
		// The copy has c's setting, naming the standby's own slot, which
		// the standby lacks: once promoted its walsenders would wait for it.
		s.settings["synchronized_standby_slots"] = ""
	}
	for k, v := range c.settings {
		if _, ok := s.settings[k]; !ok {
			s.settings[k] = v
		}
	}
	if err := s.startServer(ctx); err != nil {
		_ = s.Stop()
		return nil, err
	}
	return s, nil
}

// baseBackup copies c's data directory into s's between the start and
// stop of a non-exclusive backup, the WAL from the start on kept by the
// physical slot the standby then streams through.
func (c *Cluster) baseBackup(ctx context.Context, s *Cluster, slot string) error {
	conn, err := pgx.Connect(ctx, c.base.String())
	if err != nil {
		return fmt.Errorf("pgtest: connect: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `SELECT pg_create_physical_replication_slot($1, true)`, slot); err != nil {
		return fmt.Errorf("pgtest: create physical slot %s: %w", slot, err)
	}
	// The calls were renamed in 15, when the exclusive mode went; a
	// non-exclusive backup must start and stop on the same session.
	start := `SELECT pg_backup_start($1, true)`
	stop := `SELECT lsn::text, labelfile, spcmapfile FROM pg_backup_stop(true)`
	if c.major < 15 {
		start = `SELECT pg_start_backup($1, true, false)`
		stop = `SELECT lsn::text, labelfile, spcmapfile FROM pg_stop_backup(false, true)`
	}
	if _, err := conn.Exec(ctx, start, "pgtest standby "+slot); err != nil {
		return fmt.Errorf("pgtest: start backup: %w", err)
	}
	src, dst := filepath.Join(c.dir, "data"), filepath.Join(s.dir, "data")
	copyErr := copyDataDir(src, dst, s.cred)
	var lsn, label, spcmap string
	if err := conn.QueryRow(ctx, stop).Scan(&lsn, &label, &spcmap); err != nil {
		return fmt.Errorf("pgtest: stop backup: %w", err)
	}
	if copyErr != nil {
		return copyErr
	}
	files := map[string]string{"backup_label": label, "standby.signal": ""}
	if spcmap != "" {
		files["tablespace_map"] = spcmap
	}
	for f, text := range files {
		if err := writeOwned(filepath.Join(dst, f), []byte(text), 0o600, s.cred); err != nil {
			return err
		}
	}
	if c.major >= 17 {
		// Logical walsenders of failover slots wait for the standby: set
		// after the copy, which must not carry it.
		if _, err := conn.Exec(ctx, `ALTER SYSTEM SET synchronized_standby_slots = `+quoteLiteral(strings.Join(c.standbySlots(slot), ","))); err != nil {
			return fmt.Errorf("pgtest: set synchronized_standby_slots: %w", err)
		}
		if _, err := conn.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
			return fmt.Errorf("pgtest: reload: %w", err)
		}
	}
	return nil
}

// standbySlots records slot among c's standbys' and returns them all.
func (c *Cluster) standbySlots(slot string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.standbys = append(c.standbys, slot)
	return append([]string(nil), c.standbys...)
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// skipContents are the directories whose contents a base backup leaves
// out (as pg_basebackup does): WAL comes by streaming, slots are the
// primary's, the rest is rebuilt at start.
var skipContents = map[string]bool{
	"pg_wal": true, "pg_replslot": true, "pg_stat_tmp": true, "pg_dynshmem": true,
	"pg_notify": true, "pg_serial": true, "pg_snapshots": true, "pg_subtrans": true,
}

// skipFiles are files of a running server that a copy must not carry.
var skipFiles = map[string]bool{
	"postmaster.pid": true, "postmaster.opts": true, "backup_label": true,
	"tablespace_map": true, "standby.signal": true, "recovery.signal": true,
	"pg_internal.init": true,
}

// copyDataDir copies a running server's data directory. Files dropped or
// truncated meanwhile are fine: WAL replay from the backup's start
// rewrites whatever changed.
func copyDataDir(src, dst string, cred *syscall.Credential) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return fmt.Errorf("pgtest: copy %s: %w", path, err)
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		} else if err != nil {
			return fmt.Errorf("pgtest: copy %s: %w", path, err)
		}
		if d.IsDir() {
			if err := mkdirOwned(target, info.Mode().Perm(), cred); err != nil {
				return err
			}
			if skipContents[rel] {
				// pg_wal's archive_status must exist.
				if rel == "pg_wal" {
					return mkdirOwned(filepath.Join(target, "archive_status"), info.Mode().Perm(), cred)
				}
				return filepath.SkipDir
			}
			return nil
		}
		if skipFiles[d.Name()] || !info.Mode().IsRegular() {
			return nil
		}
		return copyFile(path, target, info.Mode().Perm(), cred)
	})
}

func copyFile(src, dst string, perm fs.FileMode, cred *syscall.Credential) error {
	in, err := os.Open(src)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("pgtest: copy %s: %w", src, err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, perm)
	if err != nil {
		return fmt.Errorf("pgtest: copy to %s: %w", dst, err)
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return fmt.Errorf("pgtest: copy %s: %w", src, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("pgtest: copy to %s: %w", dst, err)
	}
	return chown(dst, cred)
}

func mkdirOwned(dir string, perm fs.FileMode, cred *syscall.Credential) error {
	if err := os.Mkdir(dir, perm); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("pgtest: mkdir %s: %w", dir, err)
	}
	return chown(dir, cred)
}

func writeOwned(path string, b []byte, perm fs.FileMode, cred *syscall.Credential) error {
	if err := os.WriteFile(path, b, perm); err != nil {
		return fmt.Errorf("pgtest: write %s: %w", path, err)
	}
	return chown(path, cred)
}

func chown(path string, cred *syscall.Credential) error {
	if cred == nil {
		return nil
	}
	if err := os.Lchown(path, int(cred.Uid), int(cred.Gid)); err != nil {
		return fmt.Errorf("pgtest: chown %s: %w", path, err)
	}
	return nil
}
