package execute

import (
	"sync"
	"sync/atomic"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/guard"
	"github.com/postbox-relay/postbox/relay/macro"
)

// Guard is the SSRF guard of cfg. It is built from the configuration in
// force at each check, never kept, so that a reload opens or closes
// addresses for the next connect.
func Guard(cfg *config.Config) guard.Guard {
	return guard.Guard{AllowAll: cfg.AllowPrivateTargets, Allowed: cfg.AllowedCIDRs}
}

// templates holds endpoints' URL and body templates compiled from their
// source: the configuration keeps only what was written, so a reload
// (or endpoints read from a table) swaps the strings, and no template
// compiled from an old one is ever used. Emptied when it holds
// maxTemplates, as endpoints that come and go could grow it without end.
var (
	templates     sync.Map // templateKey → compiledTemplate
	templateCount atomic.Int64
)

const maxTemplates = 4096

type templateKey struct {
	src   string
	isURL bool
}

type compiledTemplate struct {
	t   macro.Template
	err error
}

// compile is src parsed as a URL or body template, from templates when it
// was parsed before.
func compile(src string, isURL bool) (macro.Template, error) {
	k := templateKey{src, isURL}
	if c, ok := templates.Load(k); ok {
		c := c.(compiledTemplate)
		return c.t, c.err
	}
	t, err := macro.Parse(src, isURL)
	if templateCount.Add(1) > maxTemplates {
		templates.Clear()
		templateCount.Store(1)
	}
	templates.Store(k, compiledTemplate{t, err})
	return t, err
}
