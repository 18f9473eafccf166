package console

import (
	"net/http"
	"time"

	"github.com/postbox-relay/postbox/relay/internal/portal"
)

// portalTTLs are the console's choices of a portal link's life.
var portalTTLs = map[string]time.Duration{"7d": 7 * 24 * time.Hour, "30d": 30 * 24 * time.Hour, "90d": 90 * 24 * time.Hour}

// portalLink makes a partner portal link for the endpoint and shows it
// on a page of its own (never in a URL, where it would be logged).
func (c *Console) portalLink(rq *request) (string, error) {
	name := rq.r.PathValue("name")
	ttl, ok := portalTTLs[rq.r.PostFormValue("ttl")]
	if !ok {
		return "", badRequest("A portal link is valid for 7d, 30d or 90d.")
	}
	if len(rq.cfg.Portal.Key) == 0 {
		return "", badRequest("No key signs portal links: set portal.key (or signing.secrets to derive one).")
	}
	v, err := portal.Version(rq.ctx, rq.pool, name)
	if err != nil {
		return "", err
	}
	now := c.now()
	tok, id, err := portal.NewLink(rq.cfg.Portal.Key, name, v, ttl, now)
	if err != nil {
		return "", err
	}
	base := rq.cfg.Portal.PublicURL
	if base == "" {
		scheme := "http"
		if rq.r.TLS != nil {
			scheme = "https"
		}
		base = scheme + "://" + rq.r.Host
	}
	c.log.Info().Str("endpoint", name).Str("link", id).Str("by", rq.s.by()).Msg("console portal link")
	c.render(rq, http.StatusOK, "message", "Portal link", "endpoints", 0, messagePage{
		Heading: "Portal link for " + name,
		Text:    "Valid until " + now.Add(ttl).UTC().Format("2006-01-02 15:04") + " UTC. Anyone holding it sees this endpoint's deliveries: send it privately.",
		Link:    base + portal.Prefix + "link/" + tok,
		Hint:    "Revoking (on the endpoint's page, or postbox portal revoke --endpoint NAME) ends every link and session of this partner.",
		Back:    "/endpoints/" + pathEscape(name),
	})
	return "", nil
}

// portalRevoke ends every portal link and session of the endpoint.
func (c *Console) portalRevoke(rq *request) (string, error) {
	name := rq.r.PathValue("name")
	v, err := portal.Revoke(rq.ctx, rq.pool, name)
	if err != nil {
		return "", err
	}
	c.log.Info().Str("endpoint", name).Int("portal_version", v).Str("by", rq.s.by()).Msg("console portal revoke")
	c.render(rq, http.StatusOK, "message", "Portal links revoked", "endpoints", 0, messagePage{
		Heading: "Portal links of " + name + " revoked",
		Text:    "Every earlier link and open session of this partner now shows a page saying so, and nothing else.",
		Back:    "/endpoints/" + pathEscape(name),
	})
	return "", nil
}
