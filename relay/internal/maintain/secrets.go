package maintain

import (
	"context"
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/service"
)

// SecretsPollDefault is how often secrets files are checked.
const SecretsPollDefault = 2 * time.Second

// secretsWatcher reloads the configuration when a secrets file changes, so
// a rotation needs no restart and no signal.
type secretsWatcher struct {
	env    *service.Env
	log    zerolog.Logger
	reload func(*config.Config) error
	poll   time.Duration
	loops  service.Loops
}

// stamp is what tells a secrets file changed.
type stamp struct {
	mod  time.Time
	size int64
}

func newSecretsWatcher(env *service.Env, reload func(*config.Config) error) *secretsWatcher {
	return &secretsWatcher{env: env, log: env.Logger("maintain"), reload: reload, poll: SecretsPollDefault}
}

// Start notes the secrets files as they are now and watches them.
func (w *secretsWatcher) Start(ctx context.Context) error {
	seen := w.read()
	return w.loops.Start(ctx, func(ctx context.Context) {
		every(ctx, w.poll, w.poll, func(context.Context) { seen = w.check(seen) })
	})
}

// Stop ends the watch and waits for it.
func (w *secretsWatcher) Stop() { w.loops.Stop() }

// read stamps the secrets files of the configuration in force.
func (w *secretsWatcher) read() map[string]stamp {
	out := map[string]stamp{}
	for _, f := range w.env.Config().SecretFiles {
		if fi, err := os.Stat(f); err == nil {
			out[f] = stamp{fi.ModTime(), fi.Size()}
		}
	}
	return out
}

// check reloads if the files changed since seen, and returns what it saw.
func (w *secretsWatcher) check(seen map[string]stamp) map[string]stamp {
	now := w.read()
	changed := len(now) != len(seen)
	for f, s := range now {
		if seen[f] != s {
			changed = true
		}
	}
	if !changed {
		return seen
	}
	next, err := w.env.Config().File.Resolve()
	if err == nil {
		err = w.reload(next)
	}
	if err != nil {
		w.log.Error().Err(err).Msg("a secrets file changed but does not load; keeping the secrets in use")
		return now
	}
	w.log.Info().Msg("signing secrets reloaded: a secrets file changed")
	return now
}
