package relay

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/portal"
)

// portal returns the relay's partner portal, made once.
func (r *Relay) portal() *portal.Portal {
	if r.portalH == nil {
		r.portalH = portal.New(portal.Options{Pool: r.pool, Config: r.cfg.Load, Version: Version, Log: r.opts.Logger, Now: r.opts.now})
	}
	return r.portalH
}

// listenPortal binds portal_listen: the portal's pages alone (every other
// path is not found there), plain HTTP, for a reverse proxy to publish
// without the console.
func (r *Relay) listenPortal(cfg *config.Config) error {
	ln, err := net.Listen("tcp", cfg.PortalListen)
	if err != nil {
		return fmt.Errorf("portal listener on %s: %w", cfg.PortalListen, err)
	}
	srv := &http.Server{Handler: r.portal(), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: time.Minute, IdleTimeout: time.Minute}
	r.portalAddr.Store(ln.Addr().String())
	r.portalSrv.Store(srv)
	r.serve.Add(1)
	go func() {
		defer r.serve.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			r.log.Error().Err(err).Msg("portal listener failed")
		}
	}()
	r.log.Info().Str("addr", ln.Addr().String()).Msg("portal listener")
	return nil
}

// PortalAddr is the address portal_listen is bound to ("" when none, or
// before Start has bound it).
func (r *Relay) PortalAddr() string {
	a, _ := r.portalAddr.Load().(string)
	return a
}

// PortalLinkDefaultTTL is how long a portal link opens the portal.
const PortalLinkDefaultTTL = 30 * 24 * time.Hour

// PortalLink is a link that opens endpoint's partner portal.
type PortalLink struct {
	URL     string
	LinkID  string
	Expires time.Time
}

// NewPortalLink makes a link to endpoint's portal valid for ttl, signed
// with cfg's portal key at the endpoint's current portal version. Its
// address is portal.public_url, else the admin listener's.
func NewPortalLink(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config, endpoint string, ttl time.Duration) (PortalLink, error) {
	return NewPortalLinkIn(ctx, pool, cfg, endpoint, ttl, "")
}

// NewPortalLinkIn is NewPortalLink whose report opens in time zone tz (an
// IANA name; "" is UTC).
func NewPortalLinkIn(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config, endpoint string, ttl time.Duration, tz string) (PortalLink, error) {
	v, err := portal.Version(ctx, pool, endpoint)
	if err != nil {
		return PortalLink{}, err
	}
	now := time.Now()
	tok, id, err := portal.NewLinkIn(cfg.Portal.Key, endpoint, v, ttl, now, tz)
	if err != nil {
		return PortalLink{}, err
	}
	base := cfg.Portal.PublicURL
	if base == "" {
		scheme := "http"
		if cfg.AdminTLSCert != "" {
			scheme = "https"
		}
		base = scheme + "://" + cfg.AdminListen
	}
	return PortalLink{URL: base + portal.Prefix + "link/" + tok, LinkID: id, Expires: now.Add(ttl).Truncate(time.Second)}, nil
}

// RevokePortal ends every link and session of endpoint's portal; links
// made afterwards work. It returns the new portal version.
func RevokePortal(ctx context.Context, pool *pgxpool.Pool, endpoint string) (int, error) {
	return portal.Revoke(ctx, pool, endpoint)
}
